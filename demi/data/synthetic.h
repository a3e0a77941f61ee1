// The seed program's data set: `get_data(num)` yields `num` rows of a random float32 (3, 32, 32)
// N(0, 1) image and an integer label drawn uniformly from 0..9, fed to
// GeneratorDataset(source=lambda: get_data(num), column_names=["image", "label"]) and batched by 32.
//
// As in the seed, each epoch calls the source again and so sees new random data; here the data depend
// only on (seed, epoch), so a run is reproducible (same_every_epoch = true reuses epoch 0's data, which
// makes the loss of a memorizing network fall). Labels are int32 scalars.
#pragma once

#include <cstdint>
#include <memory>

#include "demi/data/dataset.h"
#include "demi/data/sources.h"

namespace demi::data {

struct SeedDataOptions {
  int64_t channels = 3, height = 32, width = 32;
  int num_classes = 10;
  bool same_every_epoch = false;
};

// The seed's get_data(num, img_size, num_classes), as a source for GeneratorDataset.
EpochGeneratorSource seed_data_source(int64_t num, uint64_t seed, SeedDataOptions options = {});

// create_dataset(num_data, batch_size): GeneratorDataset(seed_data_source(...), {"image", "label"}) then
// batch(batch_size). With the defaults, 32 batches per epoch (the last holds 8 rows).
std::shared_ptr<Dataset> make_seed_dataset(int64_t num_data = 1000, int64_t batch_size = 32,
                                           uint64_t seed = default_data_seed(), SeedDataOptions options = {});

}  // namespace demi::data
