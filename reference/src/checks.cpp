#include "checks.hpp"

#include "cpkit/reference/layout.hpp"

namespace cpkit::reference::detail {

void check_options(const ShardOptions& options) {
  if (options.cp_size < 1) raise("cp_size", "must be >= 1, got ", options.cp_size);
  if (options.num_chunks < 1) raise("num_chunks", "must be >= 1, got ", options.num_chunks);
  if (options.pad_multiple < 1) raise("pad_multiple", "must be >= 1, got ", options.pad_multiple);
  check_layout_name(options.layout);
}

void check_images(const std::vector<Image>& images) {
  for (std::size_t i = 0; i < images.size(); ++i) {
    const auto& shape = images[i].shape;
    if (shape.size() != 3)
      raise("images", "image ", i, " has ", shape.size(), " dimensions, expected [C, H, W]");
    std::int64_t count = 1;
    for (auto d : shape) {
      if (d <= 0)
        raise("images", "image ", i, " has shape [", shape[0], ", ", shape[1], ", ", shape[2],
              "] with a non-positive size");
      count *= d;
    }
    if (static_cast<std::int64_t>(images[i].values.size()) != count)
      raise("images", "image ", i, " holds ", images[i].values.size(), " values, shape needs ",
            count);
  }
}

void check_label_values(const IntMatrix& labels) {
  for (Eigen::Index b = 0; b < labels.rows(); ++b)
    for (Eigen::Index t = 0; t < labels.cols(); ++t)
      if (labels(b, t) < 0 && labels(b, t) != kIgnoreLabel)
        raise("labels", "value ", labels(b, t), " at [", b, ", ", t,
              "] is negative and not the ignore label -100");
}

void check_embeds(const FloatRows& embeds, Eigen::Index rows, Eigen::Index cols) {
  if (static_cast<Eigen::Index>(embeds.size()) != rows)
    raise("inputs_embeds", "has ", embeds.size(), " rows but labels have ", rows);
  if (embeds[0].cols() < 1) raise("inputs_embeds", "hidden size must be >= 1, got 0");
  for (std::size_t b = 0; b < embeds.size(); ++b)
    if (embeds[b].rows() != cols || embeds[b].cols() != embeds[0].cols())
      raise("inputs_embeds", "row ", b, " has shape [", embeds[b].rows(), ", ", embeds[b].cols(),
            "] but [", cols, ", ", embeds[0].cols(), "] is required");
}

}  // namespace cpkit::reference::detail
