// Input checks shared by the reference's preparation functions (internal header).
#pragma once

#include "cpkit/reference/batch.hpp"
#include "cpkit/reference/error.hpp"

namespace cpkit::reference::detail {

void check_options(const ShardOptions& options);
void check_images(const std::vector<Image>& images);

template <class Scalar>
void check_shape(const char* argument, const Matrix<Scalar>& m, Eigen::Index rows,
                 Eigen::Index cols) {
  if (m.rows() != rows || m.cols() != cols)
    raise(argument, "has shape [", m.rows(), ", ", m.cols(), "] but [", rows, ", ", cols,
          "] is required");
}

// Every label is -100 or a non-negative class id (the vocabulary bound is the loss's check).
void check_label_values(const IntMatrix& labels);

// inputs_embeds: `rows` matrices of [cols, H] with one H > 0 for all.
void check_embeds(const FloatRows& embeds, Eigen::Index rows, Eigen::Index cols);

}  // namespace cpkit::reference::detail
