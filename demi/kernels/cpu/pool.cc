// Dispatch of the pooling kernels (pool.h): the 2x2 / stride-2 kernels (AVX-512, AVX2, or the portable
// ones below) where no window reaches padding, the reference loops otherwise; planes split over the thread pool.
#include "demi/kernels/cpu/pool.h"

#include <cstring>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/half.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/pool_kernels.h"

namespace demi::kernels {
namespace cpu_internal {
namespace {

// The portable 2x2 / stride-2 kernels (below AVX2): one pass, f32 compute, the same window order and
// tie / NaN rules as the reference (pool_avx512.cc explains the pairwise form).
inline bool takes(float kept, float later) { return later > kept || (later != later && kept == kept); }

template <typename T>
void max_forward_portable(const Pool2x2Geometry& g, const void* xv, void* yv, uint8_t* argmax, bool relu) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  for (int64_t plane = 0; plane < g.planes; ++plane) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const T* r0 = x + (plane * g.h + 2 * oy) * g.w;
      const T* r1 = r0 + g.w;
      int64_t o = (plane * g.oh + oy) * g.ow;
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        float a = static_cast<float>(r0[2 * ox]), b = static_cast<float>(r0[2 * ox + 1]);
        float c = static_cast<float>(r1[2 * ox]), d = static_cast<float>(r1[2 * ox + 1]);
        bool m01 = takes(a, b), m23 = takes(c, d);
        float p0 = m01 ? b : a, p1 = m23 ? d : c;
        bool mf = takes(p0, p1);
        float m = mf ? p1 : p0;
        uint8_t idx = static_cast<uint8_t>(mf ? (m23 ? 3 : 2) : (m01 ? 1 : 0));
        if (relu && !(m > 0)) {
          if (m < 0) m = 0;
          idx = kArgmaxNone;
        }
        y[o + ox] = T(m);
        if (argmax) argmax[o + ox] = idx;
      }
    }
  }
}

template <typename T>
void max_backward_portable(const Pool2x2Geometry& g, const void* dyv, const uint8_t* argmax, void* dxv) {
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  for (int64_t plane = 0; plane < g.planes; ++plane) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      T* d0 = dx + (plane * g.h + 2 * oy) * g.w;
      T* d1 = d0 + g.w;
      int64_t o = (plane * g.oh + oy) * g.ow;
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        T v = dy[o + ox], zero{};
        uint8_t a = argmax[o + ox];
        d0[2 * ox] = a == 0 ? v : zero;
        d0[2 * ox + 1] = a == 1 ? v : zero;
        d1[2 * ox] = a == 2 ? v : zero;
        d1[2 * ox + 1] = a == 3 ? v : zero;
      }
    }
  }
}

template <typename T>
void avg_forward_portable(const Pool2x2Geometry& g, const void* xv, void* yv) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  for (int64_t plane = 0; plane < g.planes; ++plane) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const T* r0 = x + (plane * g.h + 2 * oy) * g.w;
      const T* r1 = r0 + g.w;
      int64_t o = (plane * g.oh + oy) * g.ow;
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        float s = static_cast<float>(r0[2 * ox]) + static_cast<float>(r0[2 * ox + 1]);
        s = (s + static_cast<float>(r1[2 * ox])) + static_cast<float>(r1[2 * ox + 1]);
        y[o + ox] = T(s / 4.0f);
      }
    }
  }
}

template <typename T>
void avg_backward_portable(const Pool2x2Geometry& g, const void* dyv, void* dxv) {
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  for (int64_t plane = 0; plane < g.planes; ++plane) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      T* d0 = dx + (plane * g.h + 2 * oy) * g.w;
      T* d1 = d0 + g.w;
      int64_t o = (plane * g.oh + oy) * g.ow;
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        T v = T(static_cast<float>(dy[o + ox]) / 4.0f);
        d0[2 * ox] = d0[2 * ox + 1] = d1[2 * ox] = d1[2 * ox + 1] = v;
      }
    }
  }
}

template <typename T>
Pool2x2Kernels make_portable() {
  return {&max_forward_portable<T>, &max_backward_portable<T>, &avg_forward_portable<T>, &avg_backward_portable<T>};
}

}  // namespace

const Pool2x2Kernels& pool2x2_kernels_scalar(int slot) {
  static const Pool2x2Kernels kernels[3] = {make_portable<float>(), make_portable<BFloat16>(), make_portable<Half>()};
  return kernels[slot];
}

}  // namespace cpu_internal

namespace {

using cpu_internal::Pool2x2Geometry;
using cpu_internal::Pool2x2Kernels;

// Input elements per chunk below which one thread does the whole call.
constexpr int64_t kGrainElements = 1 << 15;

// The table slot of a storage dtype (0 f32, 1 bf16, 2 f16), -1 for f64 (reference only), or a demi::Error.
int slot_of(const char* op, const Pool2dParams& p, DType dtype) {
  switch (dtype) {
    case DType::kF32: return 0;
    case DType::kBF16: return 1;
    case DType::kF16: return 2;
    case DType::kF64: return -1;
    default: break;
  }
  DEMI_CHECK(false, op, ": expected float32, bfloat16, float16 or float64 data, got ", dtype_name(dtype), " for ",
             describe(p));
  return -1;
}

void check(const char* op, const Pool2dParams& p, DType dtype, bool argmax) {
  check_pool2d_params(p, op);
  slot_of(op, p, dtype);
  DEMI_CHECK(!argmax || p.kh * p.kw <= kMaxPoolWindowMax, op, ": a one-byte argmax needs a window of at most ",
             kMaxPoolWindowMax, " elements, got ", p.kh, " x ", p.kw, " for ", describe(p));
}

// The 2x2 / stride-2 kernels apply: every window inside x (no padding reached). AVX-512 or AVX2 by the
// CPU's level, the portable twins in cpu_internal below them.
const Pool2x2Kernels* fast_kernels(const Pool2dParams& p, DType dtype) {
  if (!p.is_2x2_stride_2() || dtype == DType::kF64) return nullptr;
  if (2 * p.oh > p.h || 2 * p.ow > p.w) return nullptr;  // a window reaches bottom / right padding
  if (p.pad_top != 0 || p.pad_left != 0) return nullptr;
  int slot = slot_of("pool2d", p, dtype);
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<Pool2x2Kernels, int> table{DEMI_KERNEL_TABLE_ENTRIES(pool2x2)};
  return &table.get(slot);
}

Pool2x2Geometry geometry(const Pool2dParams& p, int64_t planes) { return {planes, p.h, p.w, p.oh, p.ow}; }

// Calls f(first_plane, planes) over chunks of whole planes.
template <typename F>
void for_planes(const Pool2dParams& p, F&& f) {
  int64_t plane_elems = p.h * p.w > 0 ? p.h * p.w : 1;
  int64_t grain = kGrainElements / plane_elems;
  if (grain < 1) grain = 1;
  parallel_for(0, p.planes(), grain, [&](int64_t b, int64_t e) { f(b, e - b); });
}

// The reference kernels' geometry for `planes` planes (N = planes, C = 1).
Pool2dParams sub(const Pool2dParams& p, int64_t planes) {
  Pool2dParams q = p;
  q.n = planes;
  q.c = 1;
  return q;
}

// Calls f(T{}) with T the storage type of a float dtype.
template <typename F>
void visit_float(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: return f(float{});
    case DType::kBF16: return f(BFloat16{});
    case DType::kF16: return f(Half{});
    case DType::kF64: return f(double{});
    default: return;
  }
}

// dx rows and columns no 2x2 window covers (odd H or W in "valid" mode) get no gradient.
void zero_uncovered(const Pool2dParams& p, size_t es, char* dx, int64_t planes) {
  int64_t covered_h = 2 * p.oh, covered_w = 2 * p.ow;
  if (covered_h == p.h && covered_w == p.w) return;
  for (int64_t plane = 0; plane < planes; ++plane) {
    char* d = dx + static_cast<size_t>(plane * p.h * p.w) * es;
    if (covered_w < p.w)
      for (int64_t iy = 0; iy < covered_h; ++iy)
        std::memset(d + static_cast<size_t>(iy * p.w + covered_w) * es, 0, static_cast<size_t>(p.w - covered_w) * es);
    if (covered_h < p.h)
      std::memset(d + static_cast<size_t>(covered_h * p.w) * es, 0, static_cast<size_t>((p.h - covered_h) * p.w) * es);
  }
}

void max_forward(const char* op, const Pool2dParams& p, DType dtype, const void* x, void* y, uint8_t* argmax,
                 bool relu) {
  check(op, p, dtype, argmax != nullptr);
  size_t es = dtype_size(dtype);
  const char* xb = static_cast<const char*>(x);
  char* yb = static_cast<char*>(y);
  int64_t in_plane = p.h * p.w, out_plane = p.oh * p.ow;
  if (const Pool2x2Kernels* k = fast_kernels(p, dtype)) {
    for_planes(p, [&](int64_t first, int64_t planes) {
      k->max_forward(geometry(p, planes), xb + static_cast<size_t>(first * in_plane) * es,
                     yb + static_cast<size_t>(first * out_plane) * es, argmax ? argmax + first * out_plane : nullptr,
                     relu);
    });
    return;
  }
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    for_planes(p, [&](int64_t first, int64_t planes) {
      uint8_t* a = argmax ? argmax + first * out_plane : nullptr;
      if (relu)
        ref::relu_max_pool2d_forward(sub(p, planes), xt + first * in_plane, yt + first * out_plane, a);
      else
        ref::max_pool2d_forward(sub(p, planes), xt + first * in_plane, yt + first * out_plane, a);
    });
  });
}

}  // namespace

void max_pool2d_forward(const Pool2dParams& p, DType dtype, const void* x, void* y, uint8_t* argmax) {
  max_forward("max_pool2d_forward", p, dtype, x, y, argmax, false);
}

void relu_max_pool2d_forward(const Pool2dParams& p, DType dtype, const void* x, void* y, uint8_t* argmax) {
  max_forward("relu_max_pool2d_forward", p, dtype, x, y, argmax, true);
}

void max_pool2d_backward(const Pool2dParams& p, DType dtype, const void* dy, const uint8_t* argmax, void* dx) {
  const char* op = "max_pool2d_backward";
  check(op, p, dtype, true);
  DEMI_CHECK(argmax != nullptr, op, ": needs the argmax its forward wrote, got none for ", describe(p));
  size_t es = dtype_size(dtype);
  const char* dyb = static_cast<const char*>(dy);
  char* dxb = static_cast<char*>(dx);
  int64_t in_plane = p.h * p.w, out_plane = p.oh * p.ow;
  if (const Pool2x2Kernels* k = fast_kernels(p, dtype)) {
    for_planes(p, [&](int64_t first, int64_t planes) {
      char* d = dxb + static_cast<size_t>(first * in_plane) * es;
      k->max_backward(geometry(p, planes), dyb + static_cast<size_t>(first * out_plane) * es,
                      argmax + first * out_plane, d);
      zero_uncovered(p, es, d, planes);
    });
    return;
  }
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    for_planes(p, [&](int64_t first, int64_t planes) {
      ref::max_pool2d_backward(sub(p, planes), static_cast<const T*>(dy) + first * out_plane,
                               argmax + first * out_plane, static_cast<T*>(dx) + first * in_plane);
    });
  });
}

void avg_pool2d_forward(const Pool2dParams& p, DType dtype, const void* x, void* y) {
  check("avg_pool2d_forward", p, dtype, false);
  size_t es = dtype_size(dtype);
  int64_t in_plane = p.h * p.w, out_plane = p.oh * p.ow;
  if (const Pool2x2Kernels* k = fast_kernels(p, dtype)) {
    for_planes(p, [&](int64_t first, int64_t planes) {
      k->avg_forward(geometry(p, planes), static_cast<const char*>(x) + static_cast<size_t>(first * in_plane) * es,
                     static_cast<char*>(y) + static_cast<size_t>(first * out_plane) * es);
    });
    return;
  }
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    for_planes(p, [&](int64_t first, int64_t planes) {
      ref::avg_pool2d_forward(sub(p, planes), static_cast<const T*>(x) + first * in_plane,
                              static_cast<T*>(y) + first * out_plane);
    });
  });
}

void avg_pool2d_backward(const Pool2dParams& p, DType dtype, const void* dy, void* dx) {
  check("avg_pool2d_backward", p, dtype, false);
  size_t es = dtype_size(dtype);
  int64_t in_plane = p.h * p.w, out_plane = p.oh * p.ow;
  if (const Pool2x2Kernels* k = fast_kernels(p, dtype)) {
    for_planes(p, [&](int64_t first, int64_t planes) {
      char* d = static_cast<char*>(dx) + static_cast<size_t>(first * in_plane) * es;
      k->avg_backward(geometry(p, planes), static_cast<const char*>(dy) + static_cast<size_t>(first * out_plane) * es,
                      d);
      zero_uncovered(p, es, d, planes);
    });
    return;
  }
  visit_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    for_planes(p, [&](int64_t first, int64_t planes) {
      ref::avg_pool2d_backward(sub(p, planes), static_cast<const T*>(dy) + first * out_plane,
                               static_cast<T*>(dx) + first * in_plane);
    });
  });
}

}  // namespace demi::kernels
