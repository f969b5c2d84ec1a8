// The writer of a replay buffer (data/replay_buffer.hpp): where new rows go.
// TorchRL's RoundRobinWriter: rows in order from a cursor that wraps around
// at the storage's max_size, overwriting the oldest.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/remainder.h>

#include "../any_tensordict.hpp"
#include "../errors.hpp"
#include "../files/detail/io.hpp"
#include "storages.hpp"

namespace tensordict::data {

class RoundRobinWriter {
 public:
  // The row the next write starts at.
  std::int64_t cursor() const { return cursor_; }
  // Rows written since the buffer was made (wrapped-over ones included).
  std::int64_t write_count() const { return write_count_; }

  // `data`'s rows (its first batch dim) at the cursor and after; the rows written.
  at::Tensor extend(TensorStorage& storage, const AnyTensorDict& data) {
    if (data.batch_size().empty())
      throw shape_error("extend: the data needs a batch dim (one row per transition), got batch_size=" +
                        format_sizes(data.batch_size()) + "; add one row with add(...)");
    const std::int64_t n = data.batch_size()[0];
    if (n == 0) throw shape_error("extend: the data holds no rows (batch_size=" + format_sizes(data.batch_size()) + ")");
    storage.set_range(cursor_, data);  // checked whole before anything is written
    at::Tensor index = at::remainder(at::arange(cursor_, cursor_ + n, at::kLong), storage.max_size());
    cursor_ = (cursor_ + n) % storage.max_size();
    write_count_ += n;
    return index;
  }

  // TorchRL's writer.dumps(dir): metadata.json {"cursor", "write_count"}.
  void dumps(const std::filesystem::path& dir) const {
    std::filesystem::create_directories(dir);
    const std::string text = nlohmann::ordered_json{{"cursor", cursor_}, {"write_count", write_count_}}.dump();
    tensordict::detail::write_file_atomically((dir / "metadata.json").string(), "RoundRobinWriter.dumps",
                                              [&](std::ostream& out) { out << text; });
  }
  void loads(const std::filesystem::path& dir, std::int64_t max_size) {
    const std::string where = (dir / "metadata.json").string();
    const auto meta = nlohmann::json::parse(tensordict::detail::read_file(where, "RoundRobinWriter.loads"), nullptr, false);
    if (meta.is_discarded() || !meta.is_object() || !meta.contains("cursor") || !meta["cursor"].is_number_integer())
      throw file_error(where + ": not TorchRL's writer metadata (an integer \"cursor\")");
    const auto cursor = meta["cursor"].get<std::int64_t>();
    if (cursor < 0 || cursor >= max_size)
      throw file_error(where + ": the cursor " + std::to_string(cursor) + " is outside [0, " + std::to_string(max_size) + ")");
    const auto count = meta.contains("write_count") && meta["write_count"].is_number_integer() ? meta["write_count"].get<std::int64_t>() : 0;
    cursor_ = cursor;
    write_count_ = count;
  }

 private:
  std::int64_t cursor_ = 0;
  std::int64_t write_count_ = 0;
};

}  // namespace tensordict::data
