// The adapter of AdaptiveLogSoftmaxWithLoss: its tensors are its head Linear's
// and its tail's (a ModuleList of one Sequential of two Linears per cluster:
// head.weight, tail.0.0.weight, tail.0.1.weight, ...), so it has no
// compile-time schema and from_module gives an AnyTensorDict. Its functional
// form computes the module's forward (input, target) -> ASMoutput with those
// tensors. No batched form (its output is not a tensor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/TensorIndexing.h>
#include <ATen/ops/linear.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/adaptive.h>

#include "../../any_tensordict.hpp"

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
using adaptive_family = type_list<torch::nn::AdaptiveLogSoftmaxWithLossImpl>;
}  // namespace detail

template <>
struct runtime_layout<torch::nn::AdaptiveLogSoftmaxWithLossImpl> {
  static constexpr bool is_runtime_layout = true;
  // Every tensor belongs to the head or the tail: none of its own.
  static std::vector<std::pair<std::string, at::Tensor*>> members(torch::nn::AdaptiveLogSoftmaxWithLossImpl&) { return {}; }
};

template <>
struct functional<torch::nn::AdaptiveLogSoftmaxWithLossImpl> {
  static constexpr bool is_functional = true;
  using Impl = torch::nn::AdaptiveLogSoftmaxWithLossImpl;

  static at::Tensor head(const AnyTensorDict& p, const at::Tensor& x) {
    const at::Tensor bias = p.contains("head", "bias") ? p.get("head", "bias") : at::Tensor();
    return at::linear(x, p.get("head", "weight"), bias);
  }
  static at::Tensor cluster(const AnyTensorDict& p, std::size_t i, const at::Tensor& x) {
    const std::string index = std::to_string(i);
    return at::linear(at::linear(x, p.get("tail", index, "0", "weight")), p.get("tail", index, "1", "weight"));
  }

  // As AdaptiveLogSoftmaxWithLossImpl::forward, with p's tensors.
  static torch::nn::ASMoutput forward(const Impl& m, const AnyTensorDict& p, const at::Tensor& input_, const at::Tensor& target_) {
    using at::indexing::TensorIndex;
    const std::int64_t target_dims = target_.dim();
    TORCH_CHECK(target_dims <= 1, "AdaptiveLogSoftmaxWithLoss: 0-D or 1-D target tensor expected, multi-target not supported");
    TORCH_CHECK(input_.dim() == target_dims + 1, "AdaptiveLogSoftmaxWithLoss: input of ", target_dims + 1,
                " dims expected for a target of ", target_dims, ", got ", input_.dim());
    const bool batched_input = target_dims > 0;
    const at::Tensor input = batched_input ? input_ : input_.unsqueeze(0);
    const at::Tensor target = batched_input ? target_ : target_.unsqueeze(0);
    TORCH_CHECK(input.size(0) == target.size(0),
                "AdaptiveLogSoftmaxWithLoss: input and target should have the same size in the batch dimension.");
    const std::int64_t batch_size = target.size(0);
    at::Tensor output = input.new_zeros(batch_size);
    at::Tensor gather_inds = target.new_empty(batch_size);
    std::vector<std::int64_t> bounds{0};
    bounds.insert(bounds.end(), m.cutoffs.begin(), m.cutoffs.end());
    std::int64_t used_rows = 0;
    for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
      const at::Tensor target_mask = (target >= bounds[i]) * (target < bounds[i + 1]);
      const at::Tensor row_indices = target_mask.nonzero().squeeze();
      if (row_indices.numel() == 0) continue;
      if (i == 0) {
        gather_inds.index_copy_(0, row_indices, target.index({TensorIndex(target_mask)}));
      } else {
        const at::Tensor relative_target = target.index({TensorIndex(target_mask)}) - bounds[i];
        const at::Tensor cluster_output = cluster(p, i - 1, input.index_select(0, row_indices));
        gather_inds.index_fill_(0, row_indices, m.shortlist_size + static_cast<std::int64_t>(i) - 1);
        const at::Tensor local = cluster_output.log_softmax(1).gather(1, relative_target.unsqueeze(1));
        output.index_copy_(0, row_indices, local.squeeze(1));
      }
      used_rows += row_indices.numel();
    }
    TORCH_CHECK(used_rows == batch_size, "AdaptiveLogSoftmaxWithLoss: target values should be in [0, ",
                m.options.n_classes() - 1, "], but values in range [", target.min().item().toDouble(), ", ",
                target.max().item().toDouble(), "] were found. ");
    output = output + head(p, input).log_softmax(1).gather(1, gather_inds.unsqueeze(1)).squeeze();
    const double loss = (-output).mean().item().toDouble();
    return {batched_input ? output : output.squeeze(0), loss};
  }
};

}  // namespace tensordict::nn
