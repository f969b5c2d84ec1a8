#include <tensordict/tensordict.hpp>
int main() { return 0; }
