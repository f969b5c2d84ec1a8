// Files as bytes: a read-only view of a whole file through a private
// (copy-on-write) memory mapping, reading a file into memory, and writing one
// atomically (a temporary of its own beside it, then a rename), a directory
// too. POSIX (renameat2 on Linux); libtorch-free.
//
// A mapping is MAP_PRIVATE with read and write access: tensors over it may be
// written in place, which copies the touched pages into this process's memory
// and never changes the file (nor is a change of the file by another process
// guaranteed to stay invisible: pages not yet touched are read from the file).
// A shared one (MAP_SHARED, the file opened for writing) writes through to the file.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "../../errors.hpp"
#include "shared_mappings.hpp"

namespace tensordict::detail {

// How errors name the file: `verb("path"): `, or `path: ` for an empty verb
// (a file inside a directory that the caller names).
inline std::string naming(const char* verb, const std::string& path) {
  return *verb ? std::string(verb) + "(\"" + path + "\"): " : path + ": ";
}

class mapped_file {
 public:
  // `verb` names the call in errors ("tensordict::load"; see naming).
  static std::shared_ptr<const mapped_file> open(const std::string& path, const char* verb, bool shared = false) {
    const std::string where = naming(verb, path);
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw file_error(where + "it is a directory, not a file");
    const int fd = ::open(path.c_str(), (shared ? O_RDWR : O_RDONLY) | O_CLOEXEC);
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
      void* data = ::mmap(nullptr, out->size_, PROT_READ | PROT_WRITE, shared ? MAP_SHARED : MAP_PRIVATE, fd, 0);
      if (data == MAP_FAILED) {
        const int error = errno;
        ::close(fd);
        throw file_error(where + "cannot map it into memory: " + std::strerror(error));
      }
      out->data_ = static_cast<char*>(data);
      if (shared) {
        add_shared_mapping(out->data_, out->size_, std::filesystem::weakly_canonical(path, ec).string());
        out->shared_ = true;
      }
    }
    ::close(fd);  // the mapping stays valid without the descriptor
    return out;
  }

  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() {
    if (shared_) remove_shared_mapping(data_);
    if (data_) ::munmap(data_, size_);
  }

  std::string_view bytes() const { return {data_, size_}; }
  // Writable (through copy-on-write unless shared); for tensors that point into the file.
  char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  mapped_file() = default;
  char* data_ = nullptr;
  std::size_t size_ = 0;
  bool shared_ = false;
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

// Whether `text` is valid UTF-8 (what a JSON header needs of key names):
// no stray continuation bytes, overlong forms, surrogates or code points past U+10FFFF.
inline bool valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    std::uint32_t code = n == 1 ? c : c & (0x7F >> n);
    for (std::size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      if ((d >> 6) != 0x2) return false;
      code = (code << 6) | (d & 0x3F);
    }
    constexpr std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < least[n] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// Where a save writes: `path`, or the file a symbolic link at `path` points
// to, followed through every link (as Python's open(path, "wb") writes).
inline std::filesystem::path write_target(const std::string& path, const std::string& where) {
  namespace fs = std::filesystem;
  fs::path target = path;
  std::error_code ec;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(target, ec)); ++hops) {
    if (hops == 40) throw file_error(where + "too many levels of symbolic links");
    const fs::path next = fs::read_symlink(target, ec);
    if (ec) throw file_error(where + "cannot read the symbolic link " + target.string() + ": " + ec.message());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return target;
}

// A name beside `target` that no other save (another thread or process) uses.
inline std::filesystem::path unique_beside(const std::filesystem::path& target, const char* what) {
  static std::atomic<unsigned long> counter{0};
  return target.string() + "." + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
}

// Writes `size` bytes to a new file (mode 0666 less the umask); errors name the
// file and the OS reason.
inline void write_new_file(const std::filesystem::path& file, const char* data, std::size_t size, const std::string& where) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw file_error(where + "cannot create " + file.string() + ": " + std::strerror(errno));
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(file.c_str());
      throw file_error(where + "writing " + file.string() + " failed: " + std::strerror(error));
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(file.c_str());
    throw file_error(where + "writing " + file.string() + " failed: " + std::strerror(error));
  }
}

// A new file of `size` zero bytes, which takes no space until written where
// the file system has sparse files (ftruncate).
inline void create_sized_file(const std::filesystem::path& file, std::uint64_t size, const std::string& where) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw file_error(where + "cannot create " + file.string() + ": " + std::strerror(errno));
  const bool sized = ::ftruncate(fd, static_cast<off_t>(size)) == 0;
  int error = sized ? 0 : errno;
  const bool closed = ::close(fd) == 0;  // once: a second close could close a descriptor another thread just opened
  if (!sized || !closed) {
    if (sized) error = errno;
    ::unlink(file.c_str());
    throw file_error(where + "cannot give " + file.string() + " its size of " + std::to_string(size) + " bytes: " + std::strerror(error));
  }
}

// `write` fills the stream; the file appears whole or not at all, and a failed
// write leaves an existing file as it was. The bytes go to a temporary of its
// own beside the file (concurrent saves of one path do not share it), which
// takes the existing file's permissions and is renamed over it; a symbolic
// link is written through (the link stays, its target is replaced). Errors
// of `write` propagate after the temporary is removed.
inline void write_file_atomically(const std::string& path, const char* verb, const std::function<void(std::ostream&)>& write) {
  const std::string where = naming(verb, path);
  if (path.empty()) throw file_error(where + "the path is empty");
  const std::filesystem::path target = write_target(path, where);
  std::error_code ec;
  if (std::filesystem::is_directory(target, ec)) throw file_error(where + "it is a directory, not a file");
  const std::filesystem::path temporary = unique_beside(target, "tensordict-partial");
  write_new_file(temporary, nullptr, 0, where);  // created here: a name of its own, mode 0666 less the umask
  try {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw file_error(where + "cannot open " + temporary.string() + ": " + std::strerror(errno));
    write(out);
    out.flush();
    if (!out) throw file_error(where + "writing " + temporary.string() + " failed: " + std::strerror(errno ? errno : EIO));
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
  struct stat existing {};
  if (::stat(target.c_str(), &existing) == 0) ::chmod(temporary.c_str(), existing.st_mode & 07777);
  if (std::rename(temporary.c_str(), target.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw file_error(where + "cannot replace it: " + reason);
  }
}

// Puts the directory `ready` at `target` in one step: where `target` exists
// the two are exchanged (Linux renameat2's RENAME_EXCHANGE, so `target` is
// never missing) and the old one is removed; elsewhere, or where the file
// system cannot exchange, the old one is moved aside first. Another save
// putting its own directory there at the same time is taken in turn.
inline void replace_directory(const std::filesystem::path& ready, const std::filesystem::path& target, const std::string& where) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (int attempt = 0;; ++attempt) {
    if (std::rename(ready.c_str(), target.c_str()) == 0) return;  // no `target`, or an empty directory there
    if ((errno != EEXIST && errno != ENOTEMPTY) || attempt == 100)
      throw file_error(where + "cannot put the directory in place: " + std::strerror(errno));
#if defined(__linux__) && defined(RENAME_EXCHANGE)
    if (::renameat2(AT_FDCWD, ready.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(ready, ec);  // the old directory, now at `ready`
      return;
    }
    if (errno == ENOENT) continue;  // removed meanwhile
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      throw file_error(where + "cannot put the directory in place: " + std::strerror(errno));
#endif
    const fs::path old = unique_beside(target, "tensordict-old");
    if (std::rename(target.c_str(), old.c_str()) != 0) {
      if (errno == ENOENT) continue;
      throw file_error(where + "cannot move the old directory aside: " + std::strerror(errno));
    }
    const bool placed = std::rename(ready.c_str(), target.c_str()) == 0;
    const int error = errno;
    fs::remove_all(old, ec);
    if (placed) return;
    if (error != EEXIST && error != ENOTEMPTY)
      throw file_error(where + "cannot put the directory in place: " + std::strerror(error));
  }
}

}  // namespace tensordict::detail
