// The file format of Python's torch.save (the zip one, the default since
// PyTorch 1.6), read and written without libtorch:
//
//   <name>/data.pkl      a pickle (protocol 2) of the saved object; tensors are
//                        torch._utils._rebuild_tensor_v2(persistent storage id,
//                        offset, sizes, strides, requires_grad, hooks)
//   <name>/data/<key>    the bytes of each storage, little-endian, uncompressed
//   <name>/version       "3"
//
// The reader understands what torch.save writes for dicts of tensors: plain
// dicts of any size, collections.OrderedDict (every state_dict(), with its
// _metadata), nested dicts, nn.Parameter, tensors that share a storage. It
// checks every length, offset and extent against the bytes it was given and
// throws tensordict::file_error for anything else: the bytes come from
// outside, and a fuzz target (tests/fuzz) runs it on mutated files.
//
// Libtorch-free on purpose: the fuzz target compiles with clang's libFuzzer.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../errors.hpp"

namespace tensordict::detail::archive {

// ---- bytes ----------------------------------------------------------------------

inline std::uint32_t crc32(const unsigned char* data, std::size_t size, std::uint32_t crc = 0) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

// Little-endian reads that check the bounds.
class reader {
 public:
  reader(std::string_view bytes, const char* what) : bytes_(bytes), what_(what) {}

  std::size_t position() const { return pos_; }
  std::size_t remaining() const { return bytes_.size() - pos_; }
  bool at_end() const { return pos_ == bytes_.size(); }

  std::string_view take(std::size_t n) {
    if (n > remaining())
      throw file_error(std::string(what_) + " is truncated: needs " + std::to_string(n) + " bytes at offset " +
                       std::to_string(pos_) + ", " + std::to_string(remaining()) + " left");
    auto out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  template <class T>
  T little() {
    auto raw = take(sizeof(T));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::uint64_t(static_cast<unsigned char>(raw[i])) << (8 * i);
    T out;
    std::memcpy(&out, &v, sizeof(T));  // the low bytes on a little-endian machine
    return out;
  }
  std::uint8_t byte() { return static_cast<std::uint8_t>(take(1)[0]); }
  std::string_view line() {
    const std::size_t end = bytes_.find('\n', pos_);
    if (end == std::string_view::npos) throw file_error(std::string(what_) + " is truncated: a line has no end");
    auto out = bytes_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }

 private:
  std::string_view bytes_;
  const char* what_;
  std::size_t pos_ = 0;
};

template <class T>
void put_little(std::string& out, T value) {
  std::uint64_t v = 0;
  std::memcpy(&v, &value, sizeof(T));
  for (std::size_t i = 0; i < sizeof(T); ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

// ---- zip ------------------------------------------------------------------------------

struct zip_entry {
  std::string name;
  std::size_t offset = 0;  // of the data
  std::size_t size = 0;
  std::uint32_t crc = 0;
};

// The entries of a zip archive whose members are stored (torch.save never compresses).
inline std::vector<zip_entry> zip_entries(std::string_view file) {
  constexpr std::uint32_t end_signature = 0x06054b50, zip64_locator = 0x07064b50, zip64_end = 0x06064b50;
  constexpr std::uint32_t central_signature = 0x02014b50, local_signature = 0x04034b50;
  if (file.size() < 22) throw file_error("not a torch.save file: " + std::to_string(file.size()) + " bytes is too short for a zip archive");
  // The end record is within the last 64 KiB + 22 bytes (its comment is at most 65535 bytes).
  std::size_t end = std::string_view::npos;
  const std::size_t lowest = file.size() > 65557 ? file.size() - 65557 : 0;
  for (std::size_t p = file.size() - 22 + 1; p-- > lowest;) {
    reader r(file.substr(p, 4), "the zip archive");
    if (r.little<std::uint32_t>() == end_signature) {
      end = p;
      break;
    }
  }
  if (end == std::string_view::npos) {
    if (static_cast<unsigned char>(file[0]) == 0x80)
      throw file_error("a torch.save file in the legacy format (_use_new_zipfile_serialization=False) is not supported; "
                       "save it again with torch.save's default format");
    throw file_error("not a torch.save file: no zip end record (truncated, or not a zip archive)");
  }
  reader e(file.substr(end), "the zip end record");
  e.take(4);
  const std::uint16_t disk = e.little<std::uint16_t>(), directory_disk = e.little<std::uint16_t>();
  e.take(2);
  std::uint64_t count = e.little<std::uint16_t>();
  std::uint64_t directory_size = e.little<std::uint32_t>();
  std::uint64_t directory_offset = e.little<std::uint32_t>();
  if (disk != 0 || directory_disk != 0) throw file_error("the zip archive spans several disks");
  if (count == 0xFFFF || directory_size == 0xFFFFFFFF || directory_offset == 0xFFFFFFFF) {
    if (end < 20) throw file_error("the zip64 locator is missing");
    reader l(file.substr(end - 20, 20), "the zip64 locator");
    if (l.little<std::uint32_t>() != zip64_locator) throw file_error("the zip64 locator is missing");
    l.take(4);
    const std::uint64_t at = l.little<std::uint64_t>();
    if (at >= file.size()) throw file_error("the zip64 end record is outside the file");
    reader z(file.substr(at), "the zip64 end record");
    if (z.little<std::uint32_t>() != zip64_end) throw file_error("the zip64 end record has a wrong signature");
    z.take(8 + 2 + 2 + 4 + 4 + 8);
    count = z.little<std::uint64_t>();
    directory_size = z.little<std::uint64_t>();
    directory_offset = z.little<std::uint64_t>();
  }
  if (directory_offset > file.size() || directory_size > file.size() - directory_offset)
    throw file_error("the zip central directory lies outside the file (offset " + std::to_string(directory_offset) + ", " +
                     std::to_string(directory_size) + " bytes, file " + std::to_string(file.size()) + " bytes)");
  if (count > directory_size / 46) throw file_error("the zip central directory is too small for its entry count");
  reader d(file.substr(directory_offset, directory_size), "the zip central directory");
  std::vector<zip_entry> out;
  out.reserve(count);
  for (std::uint64_t k = 0; k < count; ++k) {
    if (d.little<std::uint32_t>() != central_signature) throw file_error("a zip central directory entry has a wrong signature");
    d.take(4);
    const std::uint16_t flags = d.little<std::uint16_t>(), method = d.little<std::uint16_t>();
    d.take(4);
    zip_entry entry;
    entry.crc = d.little<std::uint32_t>();
    std::uint64_t compressed = d.little<std::uint32_t>();
    std::uint64_t size = d.little<std::uint32_t>();
    const std::uint16_t name_length = d.little<std::uint16_t>(), extra_length = d.little<std::uint16_t>(),
                        comment_length = d.little<std::uint16_t>();
    d.take(8);
    std::uint64_t local = d.little<std::uint32_t>();
    entry.name = std::string(d.take(name_length));
    reader extra(d.take(extra_length), "a zip extra field");
    while (extra.remaining() >= 4) {
      const std::uint16_t id = extra.little<std::uint16_t>(), length = extra.little<std::uint16_t>();
      reader field(extra.take(length), "a zip64 extra field");
      if (id != 0x0001) continue;
      if (size == 0xFFFFFFFF) size = field.little<std::uint64_t>();
      if (compressed == 0xFFFFFFFF) compressed = field.little<std::uint64_t>();
      if (local == 0xFFFFFFFF) local = field.little<std::uint64_t>();
    }
    d.take(comment_length);
    if (method != 0)
      throw file_error("the zip entry \"" + entry.name + "\" is compressed (method " + std::to_string(method) +
                       "); torch.save stores entries uncompressed");
    if (flags & 1) throw file_error("the zip entry \"" + entry.name + "\" is encrypted");
    if (compressed != size) throw file_error("the zip entry \"" + entry.name + "\" has different stored and real sizes");
    if (local > file.size() || file.size() - local < 30)
      throw file_error("the zip entry \"" + entry.name + "\" has its header outside the file");
    reader h(file.substr(local, 30), "a zip local header");
    if (h.little<std::uint32_t>() != local_signature) throw file_error("the zip entry \"" + entry.name + "\" has a wrong local header signature");
    h.take(22);
    const std::uint64_t data = local + 30 + h.little<std::uint16_t>() + std::uint64_t{h.little<std::uint16_t>()};
    if (data > file.size() || size > file.size() - data)
      throw file_error("the zip entry \"" + entry.name + "\" (" + std::to_string(size) + " bytes) extends past the end of the file");
    entry.offset = data;
    entry.size = size;
    out.push_back(std::move(entry));
  }
  return out;
}

// Writes a zip archive of stored entries, each entry's data aligned to 64
// bytes as torch.save aligns it (so that a reader may map it).
class zip_writer {
 public:
  void add(std::string name, std::string_view data) {
    if (out_.size() > 0xFFFFFFFFu || data.size() > 0xFFFFFFFFu)
      throw file_error("tensordict::save: files over 4 GiB are not supported");
    central_entry e{std::move(name), static_cast<std::uint32_t>(out_.size()), static_cast<std::uint32_t>(data.size()),
                    crc32(reinterpret_cast<const unsigned char*>(data.data()), data.size())};
    const std::size_t header_end = out_.size() + 30 + e.name.size() + 4;  // with an extra field header
    const std::size_t padding = (64 - header_end % 64) % 64;
    put_little<std::uint32_t>(out_, 0x04034b50);
    put_little<std::uint16_t>(out_, 20);  // version needed
    put_little<std::uint16_t>(out_, 0);   // flags
    put_little<std::uint16_t>(out_, 0);   // stored
    put_little<std::uint32_t>(out_, 0);   // time, date
    put_little<std::uint32_t>(out_, e.crc);
    put_little<std::uint32_t>(out_, e.size);
    put_little<std::uint32_t>(out_, e.size);
    put_little<std::uint16_t>(out_, static_cast<std::uint16_t>(e.name.size()));
    put_little<std::uint16_t>(out_, static_cast<std::uint16_t>(4 + padding));
    out_ += e.name;
    put_little<std::uint16_t>(out_, 0x4246);  // "FB": torch's padding field
    put_little<std::uint16_t>(out_, static_cast<std::uint16_t>(padding));
    out_.append(padding, 'Z');
    out_ += data;
    entries_.push_back(std::move(e));
  }

  std::string finish() && {
    const std::size_t directory_offset = out_.size();
    for (const auto& e : entries_) {
      put_little<std::uint32_t>(out_, 0x02014b50);
      put_little<std::uint16_t>(out_, 20);  // made by
      put_little<std::uint16_t>(out_, 20);  // needed
      put_little<std::uint16_t>(out_, 0);
      put_little<std::uint16_t>(out_, 0);
      put_little<std::uint32_t>(out_, 0);
      put_little<std::uint32_t>(out_, e.crc);
      put_little<std::uint32_t>(out_, e.size);
      put_little<std::uint32_t>(out_, e.size);
      put_little<std::uint16_t>(out_, static_cast<std::uint16_t>(e.name.size()));
      put_little<std::uint16_t>(out_, 0);  // extra
      put_little<std::uint16_t>(out_, 0);  // comment
      put_little<std::uint16_t>(out_, 0);  // disk
      put_little<std::uint16_t>(out_, 0);  // internal attributes
      put_little<std::uint32_t>(out_, 0);  // external attributes
      put_little<std::uint32_t>(out_, e.offset);
      out_ += e.name;
    }
    if (out_.size() > 0xFFFFFFFFu || entries_.size() >= 0xFFFF)
      throw file_error("tensordict::save: files over 4 GiB or with 65535 storages are not supported");
    const std::size_t directory_size = out_.size() - directory_offset;
    put_little<std::uint32_t>(out_, 0x06054b50);
    put_little<std::uint32_t>(out_, 0);  // disks
    put_little<std::uint16_t>(out_, static_cast<std::uint16_t>(entries_.size()));
    put_little<std::uint16_t>(out_, static_cast<std::uint16_t>(entries_.size()));
    put_little<std::uint32_t>(out_, static_cast<std::uint32_t>(directory_size));
    put_little<std::uint32_t>(out_, static_cast<std::uint32_t>(directory_offset));
    put_little<std::uint16_t>(out_, 0);  // comment
    return std::move(out_);
  }

 private:
  struct central_entry {
    std::string name;
    std::uint32_t offset;
    std::uint32_t size;
    std::uint32_t crc;
  };
  std::string out_;
  std::vector<central_entry> entries_;
};

// ---- pickle -------------------------------------------------------------------------------

// The element types of torch's typed storages: name (torch.FloatStorage), size, our dtype name.
struct storage_type {
  std::string_view python_name;
  std::size_t element_size;
};
inline constexpr std::array<storage_type, 12> storage_types{{
    {"FloatStorage", 4}, {"DoubleStorage", 8}, {"HalfStorage", 2}, {"BFloat16Storage", 2},
    {"LongStorage", 8}, {"IntStorage", 4}, {"ShortStorage", 2}, {"CharStorage", 1},
    {"ByteStorage", 1}, {"BoolStorage", 1}, {"ComplexFloatStorage", 8}, {"ComplexDoubleStorage", 16},
}};

inline std::optional<std::size_t> storage_type_index(std::string_view name) {
  for (std::size_t i = 0; i < storage_types.size(); ++i)
    if (storage_types[i].python_name == name) return i;
  return std::nullopt;
}

// A value of the unpickled object graph. Containers refer to other values by index.
struct value {
  enum class kind { none, boolean, integer, floating, string, tuple, list, dict, global, storage, tensor, object };
  kind type = kind::none;
  std::int64_t integer = 0;
  double floating = 0;
  std::string text;                 // string; global "module.name"; storage key; object's class
  std::vector<std::size_t> items;   // tuple, list; dict: key, value, key, value...
  // storage: type index and element count; tensor: storage value, offset, sizes, strides.
  std::size_t storage_type = 0;
  std::size_t storage = 0;
  std::int64_t offset = 0;
  std::vector<std::int64_t> sizes, strides;
  bool requires_grad = false;
};

inline const char* kind_name(value::kind k) {
  switch (k) {
    case value::kind::none: return "None";
    case value::kind::boolean: return "bool";
    case value::kind::integer: return "int";
    case value::kind::floating: return "float";
    case value::kind::string: return "str";
    case value::kind::tuple: return "tuple";
    case value::kind::list: return "list";
    case value::kind::dict: return "dict";
    case value::kind::global: return "a class or function";
    case value::kind::storage: return "a storage";
    case value::kind::tensor: return "Tensor";
    default: return "an object";
  }
}

struct unpickled {
  std::vector<value> values;
  std::size_t root = 0;
};

// Runs the subset of the pickle machine that torch.save's output uses.
inline unpickled unpickle(std::string_view bytes) {
  using k = value::kind;
  constexpr std::size_t max_dims = 64;  // bounds the work a small file can ask for
  unpickled out;
  auto& values = out.values;
  std::vector<std::size_t> stack;
  std::vector<std::size_t> marks;
  std::unordered_map<std::uint32_t, std::size_t> memo;
  reader r(bytes, "data.pkl");
  auto fail = [&](const std::string& what) -> void {
    throw file_error("data.pkl, at byte " + std::to_string(r.position()) + ": " + what);
  };
  auto make = [&](value v) {
    // Every opcode reads at least one byte, so the graph stays within a few values per byte.
    values.push_back(std::move(v));
    return values.size() - 1;
  };
  auto make_kind = [&](k type) {
    value v;
    v.type = type;
    return make(std::move(v));
  };
  auto pop = [&]() {
    if (stack.empty() || (!marks.empty() && stack.size() <= marks.back())) fail("the stack is empty");
    const std::size_t v = stack.back();
    stack.pop_back();
    return v;
  };
  auto top = [&]() -> std::size_t {
    if (stack.empty()) fail("the stack is empty");
    return stack.back();
  };
  auto pop_mark = [&]() {
    if (marks.empty()) fail("no MARK for this opcode");
    std::vector<std::size_t> items(stack.begin() + static_cast<std::ptrdiff_t>(marks.back()), stack.end());
    stack.resize(marks.back());
    marks.pop_back();
    return items;
  };
  auto as_int = [&](std::size_t v, const char* what) {
    if (values[v].type == k::boolean || values[v].type == k::integer) return values[v].integer;
    fail(std::string(what) + " is " + kind_name(values[v].type) + ", not an int");
    return std::int64_t{0};
  };
  auto int_tuple = [&](std::size_t v, const char* what) {
    if (values[v].type != k::tuple) fail(std::string(what) + " is " + kind_name(values[v].type) + ", not a tuple");
    if (values[v].items.size() > max_dims) fail(std::string(what) + " has more than " + std::to_string(max_dims) + " dims");
    std::vector<std::int64_t> ints;
    for (std::size_t item : values[v].items) ints.push_back(as_int(item, what));
    return ints;
  };
  auto add_items = [&](std::size_t target, const std::vector<std::size_t>& items, bool pairs) {
    value& t = values[target];
    if (pairs ? t.type != k::dict : (t.type != k::list)) fail(std::string("adding items to ") + kind_name(t.type));
    if (pairs && items.size() % 2) fail("SETITEMS with an odd number of items");
    t.items.insert(t.items.end(), items.begin(), items.end());
  };
  // REDUCE and NEWOBJ: the callables that torch.save's output calls.
  auto reduce = [&](std::size_t callable, std::size_t args) {
    if (values[callable].type != k::global) fail("REDUCE of " + std::string(kind_name(values[callable].type)));
    if (values[args].type != k::tuple) fail("REDUCE with arguments that are not a tuple");
    const std::string name = values[callable].text;
    const std::vector<std::size_t>& a = values[args].items;  // read before the next make()
    if (name == "collections.OrderedDict" || name == "builtins.dict") {
      if (!a.empty()) fail(name + " with arguments");
      return make_kind(k::dict);
    }
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
      if (a.size() < 4) fail(name + " with " + std::to_string(a.size()) + " arguments");
      if (values[a[0]].type != k::storage) fail(name + " of " + kind_name(values[a[0]].type) + ", not a storage");
      value t;
      t.type = k::tensor;
      t.storage = a[0];
      t.offset = as_int(a[1], "a tensor's storage offset");
      t.sizes = int_tuple(a[2], "a tensor's sizes");
      t.strides = int_tuple(a[3], "a tensor's strides");
      if (a.size() > 4) t.requires_grad = as_int(a[4], "requires_grad") != 0;
      return make(std::move(t));
    }
    if (name == "torch._utils._rebuild_parameter") {
      if (a.size() < 2 || values[a[0]].type != k::tensor) fail(name + " without a tensor");
      value t = values[a[0]];  // a copy: make() may move the values
      t.requires_grad = as_int(a[1], "requires_grad") != 0;
      return make(std::move(t));
    }
    value o;
    o.type = k::object;
    o.text = name;
    return make(std::move(o));
  };

  for (;;) {
    const std::uint8_t op = r.byte();
    switch (op) {
      case 0x80: r.byte(); break;                   // PROTO
      case 0x95: r.take(8); break;                  // FRAME
      case '(': marks.push_back(stack.size()); break;  // MARK
      case '.':                                     // STOP
        if (stack.size() != 1 || !marks.empty()) fail("STOP with " + std::to_string(stack.size()) + " values on the stack");
        out.root = stack.back();
        return out;
      case 'N': stack.push_back(make_kind(k::none)); break;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        value v;
        v.type = k::boolean;
        v.integer = op == 0x88;
        stack.push_back(make(std::move(v)));
        break;
      }
      case 'J':
      case 'K':
      case 'M':
      case 0x8a: {  // BININT, BININT1, BININT2, LONG1
        value v;
        v.type = k::integer;
        if (op == 'J') v.integer = r.little<std::int32_t>();
        else if (op == 'K') v.integer = r.byte();
        else if (op == 'M') v.integer = r.little<std::uint16_t>();
        else {
          const std::uint8_t n = r.byte();
          if (n > 8) fail("an integer of " + std::to_string(n) + " bytes does not fit 64 bits");
          auto raw = r.take(n);
          std::uint64_t u = 0;
          for (std::size_t i = 0; i < n; ++i) u |= std::uint64_t(static_cast<unsigned char>(raw[i])) << (8 * i);
          if (n > 0 && n < 8 && (static_cast<unsigned char>(raw[n - 1]) & 0x80)) u |= ~std::uint64_t{0} << (8 * n);
          std::memcpy(&v.integer, &u, 8);
        }
        stack.push_back(make(std::move(v)));
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        auto raw = r.take(8);
        std::uint64_t u = 0;
        for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<unsigned char>(raw[i]);
        value v;
        v.type = k::floating;
        std::memcpy(&v.floating, &u, 8);
        stack.push_back(make(std::move(v)));
        break;
      }
      case 'X':
      case 0x8c:
      case 0x8d:
      case 'T':
      case 'U':
      case 'B':
      case 'C': {  // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, BINSTRING, SHORT_BINSTRING, BINBYTES, SHORT_BINBYTES
        std::uint64_t n = 0;
        if (op == 'X' || op == 'T' || op == 'B') n = r.little<std::uint32_t>();
        else if (op == 0x8d) n = r.little<std::uint64_t>();
        else n = r.byte();
        value v;
        v.type = k::string;
        v.text = std::string(r.take(static_cast<std::size_t>(std::min<std::uint64_t>(n, r.remaining() + 1))));
        stack.push_back(make(std::move(v)));
        break;
      }
      case '}': stack.push_back(make_kind(k::dict)); break;
      case ']': stack.push_back(make_kind(k::list)); break;
      case ')': stack.push_back(make_kind(k::tuple)); break;
      case 't':
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE, TUPLE1, TUPLE2, TUPLE3
        value v;
        v.type = k::tuple;
        if (op == 't') {
          v.items = pop_mark();
        } else {
          v.items.resize(op - 0x84);
          for (std::size_t i = v.items.size(); i-- > 0;) v.items[i] = pop();
        }
        stack.push_back(make(std::move(v)));
        break;
      }
      case 'l': {  // LIST
        value v;
        v.type = k::list;
        v.items = pop_mark();
        stack.push_back(make(std::move(v)));
        break;
      }
      case 'd': {  // DICT
        value v;
        v.type = k::dict;
        v.items = pop_mark();
        if (v.items.size() % 2) fail("DICT with an odd number of items");
        stack.push_back(make(std::move(v)));
        break;
      }
      case 'a': {  // APPEND
        const std::size_t item = pop();
        add_items(top(), {item}, false);
        break;
      }
      case 'e': {  // APPENDS
        auto items = pop_mark();
        add_items(top(), items, false);
        break;
      }
      case 's': {  // SETITEM
        const std::size_t v = pop(), key = pop();
        add_items(top(), {key, v}, true);
        break;
      }
      case 'u': {  // SETITEMS
        auto items = pop_mark();
        add_items(top(), items, true);
        break;
      }
      case 'q': memo[r.byte()] = top(); break;                     // BINPUT
      case 'r': memo[r.little<std::uint32_t>()] = top(); break;    // LONG_BINPUT
      case 0x94: memo[static_cast<std::uint32_t>(memo.size())] = top(); break;  // MEMOIZE
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        const std::uint32_t key = op == 'h' ? r.byte() : r.little<std::uint32_t>();
        auto it = memo.find(key);
        if (it == memo.end()) fail("BINGET of memo " + std::to_string(key) + ", which was never stored");
        stack.push_back(it->second);
        break;
      }
      case 'c': {  // GLOBAL
        value v;
        v.type = k::global;
        v.text = std::string(r.line());
        v.text += '.';
        v.text += r.line();
        stack.push_back(make(std::move(v)));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        const std::size_t name = pop(), module = pop();
        if (values[name].type != k::string || values[module].type != k::string) fail("STACK_GLOBAL of non-strings");
        value v;
        v.type = k::global;
        v.text = values[module].text + "." + values[name].text;
        stack.push_back(make(std::move(v)));
        break;
      }
      case 'Q': {  // BINPERSID: ('storage', torch.FloatStorage, key, location, numel)
        const std::size_t id = pop();
        const value& t = values[id];
        if (t.type != k::tuple || t.items.size() < 5 || values[t.items[0]].type != k::string ||
            values[t.items[0]].text != "storage")
          fail("a persistent id that is not a ('storage', type, key, location, size) tuple");
        const value& type = values[t.items[1]];
        const std::string_view type_name =
            type.type == k::global && type.text.rfind("torch.", 0) == 0 ? std::string_view(type.text).substr(6) : "";
        const auto index = storage_type_index(type_name);
        if (!index) fail("a storage of type " + (type.type == k::global ? type.text : kind_name(type.type)) + " is not supported");
        if (values[t.items[2]].type != k::string) fail("a storage key that is not a string");
        value s;
        s.type = k::storage;
        s.storage_type = *index;
        s.text = values[t.items[2]].text;
        s.integer = as_int(t.items[4], "a storage's size");
        stack.push_back(make(std::move(s)));
        break;
      }
      case 'R': {  // REDUCE
        const std::size_t args = pop(), callable = pop();
        stack.push_back(reduce(callable, args));
        break;
      }
      case 0x81: {  // NEWOBJ
        const std::size_t args = pop(), cls = pop();
        stack.push_back(reduce(cls, args));
        break;
      }
      case 'b': pop(); top(); break;  // BUILD: the state of an OrderedDict (_metadata) or an object is not kept
      case '0': pop(); break;         // POP
      case '2': stack.push_back(top()); break;  // DUP
      case '1': pop_mark(); break;     // POP_MARK
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("the pickle opcode ") + hex + " is not one that torch.save writes for dicts of tensors");
      }
    }
  }
}

// ---- what a torch.save file holds ------------------------------------------------------------

// A tensor of the file: checked against its storage's bytes.
struct tensor_record {
  std::size_t storage_type = 0;
  std::string storage_key;
  std::string_view storage_bytes;  // the whole storage
  std::int64_t offset = 0;
  std::vector<std::int64_t> sizes, strides;
  bool requires_grad = false;
};

// A dict of the file: keys in order; each entry a tensor, a sub-dict, or another Python value.
struct dict_record {
  struct entry {
    std::string key;
    std::optional<tensor_record> tensor;
    std::unique_ptr<dict_record> dict;
    std::string other;  // the Python type of a value that is neither
  };
  std::vector<entry> entries;
};

namespace detail_checks {
// The largest element a strided view reaches, with every product checked for overflow.
inline bool extent_fits(const tensor_record& t, std::uint64_t storage_elements) {
  if (t.sizes.size() != t.strides.size() || t.offset < 0) return false;
  std::uint64_t last = static_cast<std::uint64_t>(t.offset);
  for (std::size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] < 0 || t.strides[d] < 0) return false;
    if (t.sizes[d] == 0) return t.offset >= 0 && static_cast<std::uint64_t>(t.offset) <= storage_elements;
  }
  for (std::size_t d = 0; d < t.sizes.size(); ++d) {
    const auto span = static_cast<std::uint64_t>(t.sizes[d] - 1), stride = static_cast<std::uint64_t>(t.strides[d]);
    if (stride && span > (std::numeric_limits<std::uint64_t>::max() - last) / stride) return false;
    last += span * stride;
  }
  return last < storage_elements;
}
}  // namespace detail_checks

// Parses a torch.save file held in `file` (which must outlive the result's
// views). The fuzz target turns verify_checksums off to reach the pickle.
inline std::unique_ptr<dict_record> parse(std::string_view file, bool verify_checksums = true) {
  const auto entries = zip_entries(file);
  std::string prefix;
  for (const auto& e : entries)
    if (e.name.size() >= 8 && e.name.compare(e.name.size() - 8, 8, "data.pkl") == 0 &&
        (e.name.size() == 8 || e.name[e.name.size() - 9] == '/')) {
      prefix = e.name.substr(0, e.name.size() - 8);
      break;
    }
  auto find = [&](const std::string& name) -> const zip_entry* {
    for (const auto& e : entries)
      if (e.name == name) return &e;
    return nullptr;
  };
  // Every record, read or not (torch 2.x adds .data/serialization_id), once.
  if (verify_checksums)
    for (const auto& e : entries) {
      std::string_view bytes = file.substr(e.offset, e.size);
      if (crc32(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) != e.crc)
        throw file_error("the record \"" + e.name + "\" is corrupted (its CRC-32 does not match)");
    }
  auto record = [&](const std::string& name) {
    const zip_entry* e = find(prefix + name);
    if (!e) throw file_error("the archive has no record \"" + prefix + name + "\"");
    return file.substr(e->offset, e->size);
  };
  if (!find(prefix + "data.pkl")) {
    if (find(prefix + "constants.pkl") || find("constants.pkl"))
      throw file_error("this is a TorchScript archive (torch.jit.save), not a torch.save file");
    throw file_error("the archive has no data.pkl: not a torch.save file");
  }
  const std::string version_name = find(prefix + "version") ? "version" : ".data/version";
  const std::string_view version = record(version_name);
  if (version.empty() || version.size() > 4 || version[0] < '1' || version[0] > '9')
    throw file_error("the archive's format version \"" + std::string(version.substr(0, 8)) + "\" is not one torch.save writes");
  if (const zip_entry* order = find(prefix + "byteorder"); order && record("byteorder") != "little")
    throw file_error("the file was saved on a big-endian machine; only little-endian files are read");
  const unpickled graph = unpickle(record("data.pkl"));
  const auto& values = graph.values;

  std::unordered_map<std::string, std::string_view> storages;
  auto storage_bytes = [&](const value& s) {
    auto it = storages.find(s.text);
    if (it != storages.end()) return it->second;
    if (s.text.find('/') != std::string::npos || s.text.find("..") != std::string::npos)
      throw file_error("a storage key \"" + s.text + "\" names no record");
    return storages[s.text] = record("data/" + s.text);
  };
  auto tensor = [&](const value& t, const std::string& where) {
    const value& s = values[t.storage];
    tensor_record out;
    out.storage_type = s.storage_type;
    out.storage_key = s.text;
    out.storage_bytes = storage_bytes(s);
    out.offset = t.offset;
    out.sizes = t.sizes;
    out.strides = t.strides;
    out.requires_grad = t.requires_grad;
    const std::size_t element = storage_types[s.storage_type].element_size;
    if (s.integer < 0 || static_cast<std::uint64_t>(s.integer) > out.storage_bytes.size() / element)
      throw file_error(where + ": its storage \"" + s.text + "\" claims " + std::to_string(s.integer) + " elements of " +
                       std::to_string(element) + " bytes, but its record has " + std::to_string(out.storage_bytes.size()) +
                       " bytes");
    if (!detail_checks::extent_fits(out, static_cast<std::uint64_t>(s.integer)))
      throw file_error(where + ": its sizes, strides and offset reach outside its storage of " + std::to_string(s.integer) +
                       " elements");
    return out;
  };
  // Dicts nest at most this deep, and each appears once: through the memo, a
  // file could otherwise make a cycle, or a small file a huge tree.
  constexpr int max_depth = 64;
  std::vector<bool> visited(values.size());
  auto convert = [&](auto& self, std::size_t v, const std::string& where, int depth) -> std::unique_ptr<dict_record> {
    if (depth > max_depth) throw file_error(where + ": dicts nest more than " + std::to_string(max_depth) + " deep");
    if (visited[v]) throw file_error((where.empty() ? std::string("the root") : where) + ": the same dict appears twice in the file");
    visited[v] = true;
    auto out = std::make_unique<dict_record>();
    const auto& items = values[v].items;
    for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
      const value& key = values[items[i]];
      const value& item = values[items[i + 1]];
      dict_record::entry e;
      if (key.type == value::kind::string) e.key = key.text;
      else if (key.type == value::kind::integer) e.key = std::to_string(key.integer);
      else throw file_error(where + ": a key is " + kind_name(key.type) + "; keys must be strings");
      const std::string path = where.empty() ? "\"" + e.key + "\"" : where + "/\"" + e.key + "\"";
      for (const auto& seen : out->entries)
        if (seen.key == e.key) throw file_error(path + ": the key is there twice");
      if (item.type == value::kind::tensor) e.tensor = tensor(item, path);
      else if (item.type == value::kind::dict) e.dict = self(self, items[i + 1], path, depth + 1);
      else e.other = item.type == value::kind::object ? item.text : kind_name(item.type);
      out->entries.push_back(std::move(e));
    }
    return out;
  };
  if (values[graph.root].type != value::kind::dict)
    throw file_error(std::string("the file holds ") +
                     (values[graph.root].type == value::kind::object ? values[graph.root].text : kind_name(values[graph.root].type)) +
                     ", not a dict: save a dict (a state_dict() or a TensorDict's to_dict())");
  return convert(convert, graph.root, "", 0);
}

// ---- writing --------------------------------------------------------------------------------

// Pickles (protocol 2) the way torch.save does.
class pickler {
 public:
  pickler() { out_ += "\x80\x02"; }

  void empty_dict() { out_ += '}'; }
  void mark() { out_ += '('; }
  void set_items() { out_ += 'u'; }
  void string(std::string_view s) {
    out_ += 'X';
    put_little<std::uint32_t>(out_, static_cast<std::uint32_t>(s.size()));
    out_ += s;
  }
  void integer(std::int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      out_ += static_cast<char>(v);
    } else if (v >= std::numeric_limits<std::int32_t>::min() && v <= std::numeric_limits<std::int32_t>::max()) {
      out_ += 'J';
      put_little<std::int32_t>(out_, static_cast<std::int32_t>(v));
    } else {
      out_ += "\x8a\x08";
      put_little<std::int64_t>(out_, v);
    }
  }
  void global(std::string_view module, std::string_view name) {
    out_ += 'c';
    out_ += module;
    out_ += '\n';
    out_ += name;
    out_ += '\n';
  }
  void int_tuple(const std::vector<std::int64_t>& ints) {
    mark();
    for (auto i : ints) integer(i);
    out_ += 't';
  }
  // torch._utils._rebuild_tensor_v2(('storage', torch.<Type>, key, 'cpu', numel), offset, sizes, strides, requires_grad, OrderedDict())
  void tensor(std::size_t storage_type, const std::string& key, std::int64_t numel, std::int64_t offset,
              const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& strides, bool requires_grad) {
    global("torch._utils", "_rebuild_tensor_v2");
    mark();
    mark();
    string("storage");
    global("torch", storage_types[storage_type].python_name);
    string(key);
    string("cpu");
    integer(numel);
    out_ += 't';
    out_ += 'Q';
    integer(offset);
    int_tuple(sizes);
    int_tuple(strides);
    out_ += requires_grad ? '\x88' : '\x89';
    global("collections", "OrderedDict");
    out_ += ')';
    out_ += 'R';
    out_ += 't';
    out_ += 'R';
  }
  std::string finish() && {
    out_ += '.';
    return std::move(out_);
  }

 private:
  std::string out_;
};

}  // namespace tensordict::detail::archive
