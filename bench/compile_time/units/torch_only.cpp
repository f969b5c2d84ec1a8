#include <torch/torch.h>
int main() { return 0; }
