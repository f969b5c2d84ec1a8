#!/bin/sh
# Builds the loader's fuzz target with clang's libFuzzer (ASan + UBSan) and
# runs it for a bounded time on a corpus seeded with tests/data/*.pt.
#   run.sh SOURCE_ROOT BUILD_DIR SECONDS
# Exits 77 (skipped) without clang++ or its libFuzzer runtime (libclang-rt-14-dev).
set -eu
root=$1 build=$2 seconds=$3
clang=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$clang" ]; then echo "skipped: no clang++ (apt-get install clang-14)"; exit 77; fi
mkdir -p "$build/fuzz"
target="$build/fuzz/fuzz_load"
if ! "$clang" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root/include" "$root/tests/fuzz/fuzz_load.cpp" -o "$target" 2>"$build/fuzz/build.log"; then
  if grep -q "libclang_rt.fuzzer\|cannot find" "$build/fuzz/build.log"; then
    echo "skipped: no libFuzzer runtime (apt-get install libclang-rt-14-dev)"; exit 77
  fi
  cat "$build/fuzz/build.log"; exit 1
fi
corpus="$build/fuzz/corpus"
mkdir -p "$corpus"
cp "$root"/tests/data/*.pt "$corpus/"
# -rss_limit_mb: a small file must not make the reader allocate much; -timeout: nor loop.
status=0
"$target" "$corpus" -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=5 -max_len=8192 -print_final_stats=1 \
  >"$build/fuzz/run.log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then cat "$build/fuzz/run.log"; echo "the fuzzer found a failing input (saved as crash-*/leak-*/timeout-* in $(pwd))"; exit "$status"; fi
grep "^stat::\|Done" "$build/fuzz/run.log"
