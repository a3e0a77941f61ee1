// Helpers the train module's tests share (no production code includes this).
#pragma once

#include <sstream>
#include <vector>

#include "demi/train/callback.h"
#include "demi/train/model.h"

namespace demi::train::test {

// The callbacks' output goes to `os` while this lives.
struct Captured {
  std::ostringstream os;
  Captured() { set_callback_stream(&os); }
  ~Captured() { set_callback_stream(nullptr); }
  Captured(const Captured&) = delete;
  Captured& operator=(const Captured&) = delete;
};

// Every parameter of the model's network, in order, as one vector.
inline std::vector<float> weights_of(Model& m) {
  std::vector<float> w;
  for (const auto& [name, t] : m.network().parameters_and_names()) {
    auto v = t.to_vector();
    w.insert(w.end(), v.begin(), v.end());
  }
  return w;
}

}  // namespace demi::train::test
