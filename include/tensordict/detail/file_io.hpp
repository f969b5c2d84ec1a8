// Files as bytes: a read-only view of a whole file through a private
// (copy-on-write) memory mapping, reading a file into memory, and writing one
// atomically (a temporary beside it, then a rename). POSIX; libtorch-free.
//
// A mapping is MAP_PRIVATE with read and write access: tensors over it may be
// written in place, which copies the touched pages into this process's memory
// and never changes the file (nor is a change of the file by another process
// guaranteed to stay invisible: pages not yet touched are read from the file).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "../errors.hpp"

namespace tensordict::detail {

// How errors name the file: `verb("path"): `, or `path: ` for an empty verb
// (a file inside a directory that the caller names).
inline std::string naming(const char* verb, const std::string& path) {
  return *verb ? std::string(verb) + "(\"" + path + "\"): " : path + ": ";
}

class mapped_file {
 public:
  // `verb` names the call in errors ("tensordict::load"; see naming).
  static std::shared_ptr<const mapped_file> open(const std::string& path, const char* verb) {
    const std::string where = naming(verb, path);
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw file_error(where + "it is a directory, not a file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw file_error(where + "cannot open it: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int error = errno;
      ::close(fd);
      throw file_error(where + "cannot read its size: " + std::strerror(error));
    }
    auto out = std::shared_ptr<mapped_file>(new mapped_file());
    out->size_ = static_cast<std::size_t>(st.st_size);
    if (out->size_ > 0) {
      void* data = ::mmap(nullptr, out->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (data == MAP_FAILED) {
        const int error = errno;
        ::close(fd);
        throw file_error(where + "cannot map it into memory: " + std::strerror(error));
      }
      out->data_ = static_cast<char*>(data);
    }
    ::close(fd);  // the mapping stays valid without the descriptor
    return out;
  }

  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() {
    if (data_) ::munmap(data_, size_);
  }

  std::string_view bytes() const { return {data_, size_}; }
  // Writable through copy-on-write; for tensors that point into the file.
  char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  mapped_file() = default;
  char* data_ = nullptr;
  std::size_t size_ = 0;
};

inline std::string read_file(const std::string& path, const char* verb) {
  const std::string where = naming(verb, path);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw file_error(where + "it is a directory, not a file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw file_error(where + "cannot open it: " + std::strerror(errno));
  try {  // libstdc++'s filebuf throws std::ios_base::failure on a read error
    const std::streamoff size = in.tellg();
    if (size < 0) throw file_error(where + "cannot read its size");
    std::string bytes(static_cast<std::size_t>(size), '\0');
    in.seekg(0);
    in.read(bytes.data(), size);
    if (in.gcount() != size) throw file_error(where + "reading failed (" + std::to_string(in.gcount()) + " of " + std::to_string(size) + " bytes)");
    return bytes;
  } catch (const std::ios_base::failure& e) {
    throw file_error(where + "reading failed: " + e.what());
  }
}

// `write` fills the stream; the file appears whole or not at all, and a failed
// write leaves an existing file as it was. Errors of `write` propagate after
// the temporary is removed.
inline void write_file_atomically(const std::string& path, const char* verb, const std::function<void(std::ostream&)>& write) {
  const std::string where = naming(verb, path);
  const std::string temporary = path + ".tensordict-partial";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw file_error(where + "cannot create it: " + std::strerror(errno));
    try {
      write(out);
      out.flush();
    } catch (...) {
      out.close();
      std::remove(temporary.c_str());
      throw;
    }
    if (!out) {
      out.close();
      std::remove(temporary.c_str());
      throw file_error(where + "writing failed (disk full?)");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw file_error(where + "cannot replace it: " + reason);
  }
}

}  // namespace tensordict::detail
