// The adapters of the loss modules. Schema: the class weights of those that
// hold them ({weight}: CrossEntropyLoss, NLLLoss, BCELoss, MultiMarginLoss,
// MultiLabelSoftMarginLoss; {weight, pos_weight}: BCEWithLogitsLoss; unset
// where the options give none), empty for the rest. Functional form: the
// module's loss of (input, target, ...) with the TensorDict's weights. No
// batched forms: functional_vmap runs them through vmap (a loss per set).
#pragma once

#include <type_traits>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/loss.h>

#include "adapter.hpp"

namespace tensordict::nn {

namespace detail {
// The loss modules whose weight is their options' (the registered buffer "weight").
using options_weight_losses =
    type_list<torch::nn::BCELossImpl, torch::nn::MultiMarginLossImpl, torch::nn::MultiLabelSoftMarginLossImpl>;
using weighted_losses = type_list<torch::nn::BCELossImpl, torch::nn::MultiMarginLossImpl, torch::nn::MultiLabelSoftMarginLossImpl,
                                  torch::nn::CrossEntropyLossImpl, torch::nn::NLLLossImpl, torch::nn::BCEWithLogitsLossImpl>;
using unweighted_losses =
    type_list<torch::nn::L1LossImpl, torch::nn::MSELossImpl, torch::nn::KLDivLossImpl, torch::nn::HingeEmbeddingLossImpl,
              torch::nn::CosineEmbeddingLossImpl, torch::nn::SmoothL1LossImpl, torch::nn::HuberLossImpl,
              torch::nn::MultiLabelMarginLossImpl, torch::nn::SoftMarginLossImpl, torch::nn::TripletMarginLossImpl,
              torch::nn::TripletMarginWithDistanceLossImpl, torch::nn::CTCLossImpl, torch::nn::PoissonNLLLossImpl,
              torch::nn::MarginRankingLossImpl>;
using loss_family = typename concat_lists<weighted_losses, unweighted_losses>::type;

struct options_weight {
  template <class Impl>
  at::Tensor& operator()(Impl& m) const {
    return m.options.weight();
  }
};
}  // namespace detail

template <class Impl>
  requires detail::in_list_v<Impl, detail::unweighted_losses>
struct module_traits<Impl> {
  using members = member_list<>;
};
template <class Impl>
  requires detail::in_list_v<Impl, detail::options_weight_losses>
struct module_traits<Impl> {
  using members = member_list<member<"weight", detail::options_weight>>;
};
TENSORDICT_MODULE_MEMBERS(torch::nn::CrossEntropyLossImpl, TENSORDICT_MEMBER(torch::nn::CrossEntropyLossImpl, weight))
TENSORDICT_MODULE_MEMBERS(torch::nn::NLLLossImpl, TENSORDICT_MEMBER(torch::nn::NLLLossImpl, weight))
TENSORDICT_MODULE_MEMBERS(torch::nn::BCEWithLogitsLossImpl, TENSORDICT_MEMBER(torch::nn::BCEWithLogitsLossImpl, weight),
                          TENSORDICT_MEMBER(torch::nn::BCEWithLogitsLossImpl, pos_weight))

template <class Impl>
  requires detail::in_list_v<Impl, detail::weighted_losses>
struct functional<Impl> {
  static constexpr bool is_functional = true;
  static at::Tensor forward(const Impl& m, const TensorDict<schema_of<Impl>>& p, const at::Tensor& input,
                            const at::Tensor& target) {
    namespace F = torch::nn::functional;
    auto options = m.options;
    options.weight(p.leaf(0));
    if constexpr (std::is_same_v<Impl, torch::nn::CrossEntropyLossImpl>)
      return F::cross_entropy(input, target, options);
    else if constexpr (std::is_same_v<Impl, torch::nn::NLLLossImpl>)
      return F::nll_loss(input, target, options);
    else if constexpr (std::is_same_v<Impl, torch::nn::BCELossImpl>)
      return F::binary_cross_entropy(input, target, options);
    else if constexpr (std::is_same_v<Impl, torch::nn::MultiMarginLossImpl>)
      return F::multi_margin_loss(input, target, options);
    else if constexpr (std::is_same_v<Impl, torch::nn::MultiLabelSoftMarginLossImpl>)
      return F::multilabel_soft_margin_loss(input, target, options);
    else
      return F::binary_cross_entropy_with_logits(input, target, options.pos_weight(p.leaf(1)));
  }
};

}  // namespace tensordict::nn
