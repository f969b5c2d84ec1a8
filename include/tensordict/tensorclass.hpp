// Python's @tensorclass: a plain struct of tensors (and nested such structs)
// that is also a typed TensorDict. The schema is the struct itself.
//
//   struct Step {
//     at::Tensor obs, reward;
//     TENSORDICT_TENSORCLASS(Step, obs, reward)
//   };
//   struct Transition {
//     at::Tensor obs, action;
//     Step next;
//     TENSORDICT_TENSORCLASS(Transition, obs, action, next)
//   };
//   Transition t{.obs = o, .action = a, .next = {.obs = o2, .reward = r}, .batch_size = {256}};
//   Transition first = t[0];                       // indexing along the batch dims
//   Transition moved = t.to(at::kCUDA);
//   auto batch = tensordict::stack(std::vector{t, t});   // batch_size [2, 256]
//   tensordict::TensorDict<Transition::schema_t> td = t.to_tensordict();  // save, flatten_keys, ...
//
// The macro goes after the members it names, in the struct's public part. It
// adds the member `batch_size` (last, so designated initializers still work),
// the schema `schema_t`, `tensorclass_name` (the class's name as files record it:
// files/memmap.hpp's save_memmap writes it as Python's @tensorclass of that name)
// and the verbs below; the struct stays an aggregate.
// A member left undefined is an unset leaf. A nested struct's own batch_size
// is not used: the outer one applies to every leaf.
#pragma once

#include <array>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/preprocessor/punctuation/comma_if.hpp>
#include <boost/preprocessor/seq/for_each_i.hpp>
#include <boost/preprocessor/stringize.hpp>
#include <boost/preprocessor/variadic/to_seq.hpp>

#include <ATen/core/Tensor.h>

#include "schema.hpp"
#include "typed_tensordict.hpp"

namespace tensordict {

template <class T>
concept tensorclass_type = requires(const T& t) {
  typename T::schema_t;
  t.tensordict_fields();
  t.batch_size;
};

namespace detail {

template <key Name, class Member>
struct tensorclass_field {
  static_assert(tensorclass_type<Member>,
                "TENSORDICT_TENSORCLASS: every member it names must be an at::Tensor or a struct that uses "
                "TENSORDICT_TENSORCLASS itself.");
  using type = field<Name, typename Member::schema_t>;
};
template <key Name>
struct tensorclass_field<Name, at::Tensor> {
  using type = field<Name, tensor_leaf>;
};

// The members' tensors in schema order (nested structs depth first), or the
// members filled from such a sequence.
template <class T, class Out>
void gather_leaves(const T& t, Out& out, std::size_t& next) {
  std::apply(
      [&](const auto&... member) {
        (
            [&](const auto& m) {
              if constexpr (std::is_same_v<std::remove_cvref_t<decltype(m)>, at::Tensor>) out[next++] = m;
              else gather_leaves(m, out, next);
            }(member),
            ...);
      },
      t.tensordict_fields());
}
template <class T, class In>
void scatter_leaves(T& t, const In& in, std::size_t& next, c10::IntArrayRef batch) {
  t.batch_size = batch.vec();
  std::apply(
      [&](auto&... member) {
        (
            [&](auto& m) {
              if constexpr (std::is_same_v<std::remove_cvref_t<decltype(m)>, at::Tensor>) m = in.leaf(next++);
              else scatter_leaves(m, in, next, batch);
            }(member),
            ...);
      },
      t.tensordict_fields());
}

}  // namespace detail

// The typed TensorDict over a tensorclass's tensors (the same tensors), and back.
template <tensorclass_type T>
TensorDict<typename T::schema_t> to_tensordict(const T& value) {
  std::array<at::Tensor, T::schema_t::leaf_count> leaves;
  std::size_t next = 0;
  detail::gather_leaves(value, leaves, next);
  return TensorDict<typename T::schema_t>(std::move(leaves), value.batch_size);
}
template <tensorclass_type T>
T from_tensordict(const TensorDict<typename T::schema_t>& td) {
  T out{};
  std::size_t next = 0;
  detail::scatter_leaves(out, td, next, td.batch_size());
  return out;
}

// Stacks and concatenates tensorclasses as their TensorDicts.
template <tensorclass_type T>
T stack(const std::vector<T>& values, std::int64_t dim = 0) {
  std::vector<TensorDict<typename T::schema_t>> tds;
  for (const T& v : values) tds.push_back(to_tensordict(v));
  return from_tensordict<T>(stack(tds, dim));
}
template <tensorclass_type T>
T cat(const std::vector<T>& values, std::int64_t dim = 0) {
  std::vector<TensorDict<typename T::schema_t>> tds;
  for (const T& v : values) tds.push_back(to_tensordict(v));
  return from_tensordict<T>(cat(tds, dim));
}

}  // namespace tensordict

#define TENSORDICT_DETAIL_TC_FIELD(r, data, i, member) \
  BOOST_PP_COMMA_IF(i)::tensordict::detail::tensorclass_field<BOOST_PP_STRINGIZE(member), decltype(member)>::type
#define TENSORDICT_DETAIL_TC_MEMBER(r, data, i, member) BOOST_PP_COMMA_IF(i) member

// Makes the struct `Name` a tensorclass over the members named after it (see the top of this header).
#define TENSORDICT_TENSORCLASS(Name, ...)                                                                              \
  std::vector<std::int64_t> batch_size{};                                                                              \
  static constexpr const char* tensorclass_name = BOOST_PP_STRINGIZE(Name);                                            \
  using schema_t = ::tensordict::schema<BOOST_PP_SEQ_FOR_EACH_I(TENSORDICT_DETAIL_TC_FIELD, ~,                        \
                                                                BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__))>;               \
  auto tensordict_fields() { return std::tie(BOOST_PP_SEQ_FOR_EACH_I(TENSORDICT_DETAIL_TC_MEMBER, ~,                  \
                                                                      BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__))); }      \
  auto tensordict_fields() const { return std::tie(BOOST_PP_SEQ_FOR_EACH_I(TENSORDICT_DETAIL_TC_MEMBER, ~,            \
                                                                            BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__))); } \
  ::tensordict::TensorDict<schema_t> to_tensordict() const { return ::tensordict::to_tensordict(*this); }             \
  static Name from_tensordict(const ::tensordict::TensorDict<schema_t>& td) {                                         \
    return ::tensordict::from_tensordict<Name>(td);                                                                    \
  }                                                                                                                    \
  Name operator[](std::int64_t i) const { return from_tensordict(to_tensordict()[i]); }                               \
  Name index(std::initializer_list<at::indexing::TensorIndex> indices) const {                                        \
    return from_tensordict(to_tensordict().index(indices));                                                            \
  }                                                                                                                    \
  Name to(at::Device device) const { return from_tensordict(to_tensordict().to(device)); }                            \
  Name to(at::ScalarType dtype) const { return from_tensordict(to_tensordict().to(dtype)); }                          \
  Name clone() const { return from_tensordict(to_tensordict().clone()); }                                             \
  Name detach() const { return from_tensordict(to_tensordict().detach()); }                                           \
  template <class TensordictF>                                                                                         \
  Name apply(TensordictF&& f) const {                                                                                  \
    return from_tensordict(to_tensordict().apply(std::forward<TensordictF>(f)));                                       \
  }                                                                                                                    \
  template <::tensordict::key Separator = ".">                                                                         \
  auto flatten_keys() const {                                                                                          \
    return to_tensordict().template flatten_keys<Separator>();                                                         \
  }
