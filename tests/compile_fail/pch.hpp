// libtorch headers that the compile-fail snippets include through the library,
// precompiled once (g++ only): each snippet is compiled twice, and parsing
// these is most of its cost. The library's own headers are not in here, so
// the diagnostics are the ones a user sees.
#include <ATen/TensorIndexing.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
