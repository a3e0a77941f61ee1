// The seed's random data set; see synthetic.h.
#include "demi/data/synthetic.h"

#include "demi/core/error.h"
#include "demi/core/rng.h"
#include "demi/data/internal/util.h"

namespace demi::data {

EpochGeneratorSource seed_data_source(int64_t num, uint64_t seed, SeedDataOptions options) {
  DEMI_CHECK(num >= 0, "seed_data_source: num must be >= 0, got ", num);
  DEMI_CHECK(options.height > 0 && options.width > 0 && options.num_classes > 0,
             "seed_data_source: expected a positive image size and class count, got ", options.height, " x ",
             options.width, " and ", options.num_classes, " classes");
  return [num, seed, options](int64_t epoch) -> RowGenerator {
    uint64_t key = internal::mix_seed(seed, internal::kSaltSynthetic,
                                      static_cast<uint64_t>(options.same_every_epoch ? 0 : epoch));
    auto gen = std::make_shared<Generator>(key);
    return [gen, num, options, i = int64_t{0}]() mutable -> std::optional<Row> {
      if (i >= num) return std::nullopt;
      ++i;
      // img = np.random.randn(3, *img_size).astype(np.float32); label = np.random.randint(0, num_classes)
      Tensor img = normal({options.channels, options.height, options.width}, 0.0, 1.0, *gen);
      Tensor label = full(Shape(), static_cast<double>(gen->next_int(options.num_classes)), DType::kI32);
      return Row{std::move(img), std::move(label)};
    };
  };
}

std::shared_ptr<Dataset> make_seed_dataset(int64_t num_data, int64_t batch_size, uint64_t seed,
                                           SeedDataOptions options) {
  GeneratorOptions gopts;
  gopts.num_rows = num_data;
  auto ds = std::make_shared<GeneratorDataset>(seed_data_source(num_data, seed, options),
                                               Columns{"image", "label"}, gopts);
  return ds->batch(batch_size);
}

}  // namespace demi::data
