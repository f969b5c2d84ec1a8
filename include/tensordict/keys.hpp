// Compile-time keys and key paths.
//
// A key is a string known to the compiler: `td.get<"0", "weight">()` names the
// key path ("0", "weight") with two `tensordict::key` template arguments. This
// header includes no libtorch header, so it also compiles with clang.
#pragma once

#include <array>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/hana/string.hpp>

#include "detail/config.hpp"

namespace tensordict {

// A string usable as a template argument. `N` is the length without the
// terminating NUL; `chars` is public because structural types need it.
template <std::size_t N>
struct key {
  char chars[N + 1]{};

  constexpr key() = default;
  constexpr key(const char (&text)[N + 1]) {
    for (std::size_t i = 0; i <= N; ++i) chars[i] = text[i];
  }

  static constexpr std::size_t size() { return N; }
  constexpr std::string_view view() const { return {chars, N}; }
  constexpr operator std::string_view() const { return view(); }
  constexpr const char* c_str() const { return chars; }

  template <std::size_t M>
  constexpr bool operator==(const key<M>& other) const {
    return view() == other.view();
  }
};

template <std::size_t N>
key(const char (&)[N]) -> key<N - 1>;

// Builds a key of length N from a string_view that a constant expression
// produced (a joined path, a part of a split key).
template <std::size_t N>
constexpr key<N> make_key(std::string_view text) {
  key<N> out{};
  for (std::size_t i = 0; i < N; ++i) out.chars[i] = text[i];
  out.chars[N] = '\0';
  return out;
}

// Keys joined with a separator, as a new compile-time key:
// `joined_key<".", "0", "weight">` is `key<8>{"0.weight"}`.
namespace detail {
template <key Separator, key... Keys>
constexpr std::size_t joined_length() {
  std::size_t n = 0;
  ((n += Keys.size()), ...);
  return sizeof...(Keys) == 0 ? 0 : n + (sizeof...(Keys) - 1) * Separator.size();
}

template <key Separator, key... Keys>
constexpr auto join_keys() {
  key<joined_length<Separator, Keys...>()> out{};
  std::size_t pos = 0;
  bool first = true;
  auto append = [&](std::string_view part) {
    for (char c : part) out.chars[pos++] = c;
  };
  ((append(first ? std::string_view{} : Separator.view()), append(Keys.view()), first = false), ...);
  out.chars[pos] = '\0';
  return out;
}
}  // namespace detail

template <key Separator, key... Keys>
inline constexpr auto joined_key = detail::join_keys<Separator, Keys...>();

// A nested key as one compile-time key, for the key lists of key-wired modules
// (Python's ("agents", "observation")): `in_keys<"obs", nested_key<"agents",
// "observation">>`. Its parts are joined by a separator no key holds (the
// ASCII unit separator); key_parts splits it again.
inline constexpr char nested_key_separator = '\x1f';
template <key First, key... Rest>
inline constexpr auto nested_key = joined_key<key<1>{"\x1f"}, First, Rest...>;

namespace detail {
template <key K>
constexpr std::size_t key_part_count() {
  std::size_t n = 1;
  for (char c : K.view()) n += c == nested_key_separator;
  return n;
}
// Where part I of K starts and ends.
template <key K, std::size_t I>
constexpr std::pair<std::size_t, std::size_t> key_part_bounds() {
  const std::string_view v = K.view();
  std::size_t begin = 0;
  for (std::size_t part = 0; part < I; ++part) begin = v.find(nested_key_separator, begin) + 1;
  const std::size_t end = v.find(nested_key_separator, begin);
  return {begin, end == std::string_view::npos ? v.size() : end};
}
template <key K, std::size_t I>
constexpr auto key_part() {
  constexpr auto bounds = key_part_bounds<K, I>();
  return make_key<bounds.second - bounds.first>(K.view().substr(bounds.first, bounds.second - bounds.first));
}
template <key K, class Indices = std::make_index_sequence<key_part_count<K>()>>
struct key_parts_of;
template <key K, std::size_t... I>
struct key_parts_of<K, std::index_sequence<I...>> {
  // Template<"agents", "observation"> for nested_key<"agents", "observation">; Template<K> for a plain key.
  template <template <key...> class Template>
  using apply = Template<key_part<K, I>()...>;
};
}  // namespace detail

// Conversions to and from Boost.Hana's compile-time strings, so that keys can
// take part in Hana algorithms (`hana::string<'w','e','i','g','h','t'>`).
template <key K>
constexpr auto to_hana_string() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return boost::hana::string<K.chars[I]...>{};
  }(std::make_index_sequence<K.size()>{});
}

template <char... Chars>
constexpr key<sizeof...(Chars)> from_hana_string(boost::hana::string<Chars...>) {
  key<sizeof...(Chars)> out{};
  std::size_t i = 0;
  ((out.chars[i++] = Chars), ...);
  out.chars[sizeof...(Chars)] = '\0';
  return out;
}

// A run-time view of a key path, for iteration and error messages. It refers
// to static storage (the schema's tables), so it is cheap to copy.
class key_path {
 public:
  constexpr key_path() = default;
  constexpr key_path(const std::string_view* parts, std::size_t size) : parts_(parts), size_(size) {}

  constexpr std::size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr std::string_view operator[](std::size_t i) const { return parts_[i]; }
  constexpr const std::string_view* begin() const { return parts_; }
  constexpr const std::string_view* end() const { return parts_ + size_; }

  // "0.weight" for join(".").
  std::string join(std::string_view separator) const {
    std::string out;
    for (std::size_t i = 0; i < size_; ++i) {
      if (i) out += separator;
      out += parts_[i];
    }
    return out;
  }

  friend bool operator==(const key_path& a, const key_path& b) {
    if (a.size_ != b.size_) return false;
    for (std::size_t i = 0; i < a.size_; ++i)
      if (a.parts_[i] != b.parts_[i]) return false;
    return true;
  }

 private:
  const std::string_view* parts_ = nullptr;
  std::size_t size_ = 0;
};

// Python's spelling of a key path: "weight" for one key, ("0", "weight") for more.
TENSORDICT_DECL std::string format_key_path(const std::string_view* parts, std::size_t size);
#if TENSORDICT_DEFINITIONS
TENSORDICT_DECL std::string format_key_path(const std::string_view* parts, std::size_t size) {
  if (size == 1) return '"' + std::string(parts[0]) + '"';
  std::string out = "(";
  for (std::size_t i = 0; i < size; ++i) {
    if (i) out += ", ";
    out += '"';
    out += parts[i];
    out += '"';
  }
  return out + ")";
}
#endif  // TENSORDICT_DEFINITIONS

// A run-time key path, as AnyTensorDict takes them: ("0", "weight") is {"0", "weight"}.
using any_key_path = std::vector<std::string>;

// A key path as a type: `key_path_t<"0", "weight">`.
template <key... Keys>
struct key_path_t {
  static constexpr std::size_t size() { return sizeof...(Keys); }
  static constexpr std::array<std::string_view, sizeof...(Keys)> parts{Keys.view()...};
  static std::string describe() { return format_key_path(parts.data(), parts.size()); }
};

// The key path a key names: key_path_t<"agents", "observation"> for nested_key<"agents", "observation">.
template <key K>
using key_parts_t = typename detail::key_parts_of<K>::template apply<key_path_t>;

inline std::string to_string(const key_path& path) { return format_key_path(path.begin(), path.size()); }

inline std::ostream& operator<<(std::ostream& os, const key_path& path) { return os << to_string(path); }

}  // namespace tensordict
