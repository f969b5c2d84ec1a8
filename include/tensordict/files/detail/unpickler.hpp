// The pickle machine of torch.save files: protocols 2 and 4 (FRAME, MEMOIZE,
// STACK_GLOBAL), the opcodes torch.save emits for dicts, OrderedDicts, tensors
// and their storages, and the Python values a checkpoint holds beside them
// (ints, floats, strings, lists, tuples), as an object graph. It builds no
// Python object and calls nothing: a global is only a name. Libtorch-free
// (see zip_reader.hpp).
#pragma once

#include <optional>
#include <unordered_map>
#include <utility>

#include "zip_reader.hpp"

namespace tensordict::detail::archive {

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
  // dict: the state a BUILD gave it, plus one (an OrderedDict's {"_metadata": ...}); 0 for none.
  std::size_t build_state = 0;
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
    if (name == "torch.Size") {  // torch.Size((4, 3)): a tuple of ints, named as Python prints it
      if (a.size() != 1 || values[a[0]].type != k::tuple) fail("torch.Size with arguments that are not one tuple");
      value size;
      size.type = k::tuple;
      size.text = name;
      size.items = values[a[0]].items;
      for (std::size_t item : size.items) as_int(item, "a torch.Size's entry");
      return make(std::move(size));
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
      case 'b': {  // BUILD: a dict keeps its state (an OrderedDict's _metadata); an object's is not kept
        const std::size_t state = pop(), target = top();
        if (values[target].type == k::dict) values[target].build_state = state + 1;
        break;
      }
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

}  // namespace tensordict::detail::archive
