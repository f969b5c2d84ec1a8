#!/bin/sh
# Builds the file readers' fuzz target with clang's libFuzzer (ASan + UBSan) and
# runs it for a bounded time on a corpus seeded with tests/data's torch.save,
# safetensors and memmap meta.json files.
#   run.sh SOURCE_ROOT BUILD_DIR SECONDS CLANG++
# Exits 77 (skipped) without clang++ or its libFuzzer runtime (libclang-rt-14-dev,
# libclang-rt-19-dev on Debian 13).
set -eu
root=$1 build=$2 seconds=$3 clang=${4:-}
if [ -z "$clang" ]; then echo "skipped: no clang++ (apt-get install clang-14, or clang-19 on Debian 13)"; exit 77; fi
mkdir -p "$build/fuzz"
target="$build/fuzz/fuzz_load"
# Compiled and linked apart, so that ccache (where installed) can keep the object.
# (CCACHE_NOHASHDIR and CCACHE_BASEDIR: with -g and absolute paths ccache would key the
# object by the checkout's folder too.)
launcher=""
if command -v ccache >/dev/null; then launcher="env CCACHE_NOHASHDIR=1 CCACHE_BASEDIR=$root ccache"; fi
flags="-std=c++20 -DTENSORDICT_HEADER_ONLY -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
# shellcheck disable=SC2086
if ! { $launcher "$clang" $flags -I"$root/include" -c "$root/tests/fuzz/fuzz_load.cpp" -o "$target.o" &&
    "$clang" $flags "$target.o" -o "$target"; } 2>"$build/fuzz/build.log"; then
  if grep -q "libclang_rt.fuzzer\|cannot find" "$build/fuzz/build.log"; then
    echo "skipped: no libFuzzer runtime (apt-get install libclang-rt-14-dev, or libclang-rt-19-dev)"; exit 77
  fi
  cat "$build/fuzz/build.log"; exit 1
fi
corpus="$build/fuzz/corpus"
mkdir -p "$corpus"
for f in "$root"/tests/data/*.pt "$root"/tests/data/*/*.pt "$root"/tests/data/safetensors/*.safetensors; do
  cp "$f" "$corpus/$(basename "$(dirname "$f")")_$(basename "$f")"
done
# Python tensordict 0.7 to 0.14: state_dict()s, consolidated files, .tdz archives, the
# meta.json of lazy stacks, tensorclasses and 0.5+'s NonTensorStack.
for f in "$root"/tests/data/tensordict-v0.7-v0.14/*/*.pt "$root"/tests/data/tensordict-v0.7-v0.14/*/consolidated.bin \
    "$root"/tests/data/tensordict-v0.7-v0.14/v0.14.0/archive.tdz; do
  cp -f "$f" "$corpus/$(basename "$(dirname "$f")")_$(basename "$f")"
done
for f in lazy_ragged lazy_nested/ls tensorclass tensorclass_nested/tc nt_stack/names; do
  cp -f "$root/tests/data/tensordict-v0.7-v0.14/v0.14.0/$f/meta.json" "$corpus/v0.14.0_$(echo "$f" | tr / _)_meta.json"
done
for f in "$root"/tests/data/tensordict-v0.4-memmap/*/meta.json; do
  cp "$f" "$corpus/memmap_$(basename "$(dirname "$f")")_meta.json"
done
for f in "$root"/tests/data/tensordict-v0.4-nontensor/strings_and_ints/task/meta.json \
    "$root"/tests/data/tensordict-v0.4-nontensor/stacked_names/name/meta.json; do
  cp "$f" "$corpus/nontensor_$(basename "$(dirname "$f")")_meta.json"
done
# -rss_limit_mb: a small file must not make the reader allocate much; -timeout: nor loop.
status=0
"$target" "$corpus" -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=5 -max_len=8192 -print_final_stats=1 \
  >"$build/fuzz/run.log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then cat "$build/fuzz/run.log"; echo "the fuzzer found a failing input (saved as crash-*/leak-*/timeout-* in $(pwd))"; exit "$status"; fi
grep "^stat::\|Done" "$build/fuzz/run.log"
