// Embedding lookup, reference twins: gather rows of a (V, D) table by integer ids (forward) and the dense
// table gradient by scatter-add (backward). Kept forever as the oracle for demi/kernels/cpu/embedding.h
// and as the f64 path.
//
//   y[i, :] = table[ids[i], :]              (converted from the table's type to the output's)
//   dtable = 0;  dtable[ids[i], :] += dy[i, :]   (accumulated in f32, f64 for f64; ids in order)
//
// Every id must lie in [0, V): the fast kernels' dispatcher checks (and names the first bad id).
#pragma once

#include <cstdint>

namespace demi::kernels::ref {

// ids (N) Id (int32_t | int64_t), table (V, D) T -> y (N, D) Out
template <typename Id, typename T, typename Out>
void embedding_forward(const Id* ids, int64_t n, const T* table, int64_t dim, Out* y);

// ids (N) Id, dy (N, D) G -> dtable (V, D) A (A = float, or double for double dy): overwritten, not added to
template <typename Id, typename G, typename A>
void embedding_backward(const Id* ids, int64_t n, const G* dy, int64_t vocab, int64_t dim, A* dtable);

}  // namespace demi::kernels::ref
