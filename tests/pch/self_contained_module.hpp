// Precompiled (g++) and put before a self_contained test's header where every
// header of its chain includes these anyway (tests/header_chains.py --pch).
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
