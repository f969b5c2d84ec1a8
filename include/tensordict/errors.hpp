// The exceptions that tensordict throws at run time.
//
//   tensordict::error              base of all of them (a std::runtime_error)
//   ├── tensordict::key_error      a key path names no leaf (unset leaf, unknown run-time key)
//   ├── tensordict::shape_error    a batch size or leaf shape does not match
//   ├── tensordict::dtype_error    a leaf's dtype does not match
//   ├── tensordict::index_error    an index or dim is out of range for the batch dims
//   ├── tensordict::value_error    an argument value the reference rejects (its ValueError)
//   ├── tensordict::lock_error     a locked TensorDict was asked to replace a leaf
//   ├── tensordict::file_error     a file cannot be read or written, or is not a torch.save file
//   └── tensordict::module_error   a dynamic module's type has no known functional form
//
// Messages name the operation, the key path, and what was expected against
// what was found. A call that throws leaves its TensorDict unchanged.
#pragma once

#include <stdexcept>
#include <string>

namespace tensordict {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class key_error : public error {
 public:
  using error::error;
};

class shape_error : public error {
 public:
  using error::error;
};

class dtype_error : public error {
 public:
  using error::error;
};

class index_error : public error {
 public:
  using error::error;
};

class value_error : public error {
 public:
  using error::error;
};

class lock_error : public error {
 public:
  using error::error;
};

class file_error : public error {
 public:
  using error::error;
};

class module_error : public error {
 public:
  using error::error;
};

// A collective failed (tensordict/distributed.hpp): a rank died, the timeout
// passed, or the ranks' TensorDicts differ.
class distributed_error : public error {
 public:
  using error::error;
};

}  // namespace tensordict
