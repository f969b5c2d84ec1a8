#!/bin/sh
# Builds and runs tests/consume/main.cpp the way an outside project would, each
# way twice: linking libtensordict (the default) and header-only
# (-DTENSORDICT_HEADER_ONLY through tensordict-header-only / tensordict::header_only):
#   run.sh meson_subproject|pkg_config|cmake|all SOURCE_ROOT CONSUME_DIR
# (all: the three in turn, pkg_config and cmake from one installed prefix).
# TORCH_DIR, when set, is passed on as the torch_dir option.
set -eu
how=$1 src=$2 here=$3
work=${CONSUME_WORK:-}
if [ -z "$work" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
if [ "$how" = all ]; then
  for way in meson_subproject pkg_config cmake; do
    echo "== consume: $way"
    CONSUME_WORK="$work" sh "$0" "$way" "$src" "$here"
  done
  exit 0
fi

torch_option=""
if [ -n "${TORCH_DIR:-}" ]; then torch_option="-Dtorch_dir=$TORCH_DIR"; fi

install_library() {
  [ -d "$work/prefix" ] && return 0
  meson setup "$work/library" "$src" --prefix "$work/prefix" \
    -Dtests=false -Dexamples=false -Dbenchmarks=false $torch_option >"$work/setup.log" 2>&1 ||
    { cat "$work/setup.log"; exit 1; }
  meson install -C "$work/library" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
}

case $how in
  meson_subproject)
    # The README's steps: the wrap file in subprojects/, the checkout where it
    # names its directory (as `meson subprojects download` leaves it; here a
    # link to this checkout, so nothing is fetched), dependency('tensordict'),
    # and a release build (Meson's default, debug, compiles at -O0).
    mkdir -p "$work/app/subprojects"
    cp "$here/meson/meson.build" "$here/main.cpp" "$work/app/"
    cp "$here/meson/tensordict.wrap" "$work/app/subprojects/"
    ln -s "$src" "$work/app/subprojects/tensordict"
    subproject_option=""
    if [ -n "$torch_option" ]; then subproject_option="-Dtensordict:torch_dir=$TORCH_DIR"; fi
    meson setup "$work/build" "$work/app" --buildtype=release $subproject_option
    # The recipe's build type reaches the consumer's compile command (Meson's default compiles at -O0).
    grep -q -- '-O3' "$work/build/compile_commands.json" ||
      { echo "consume: the consumer is not compiled at -O3 (--buildtype=release)"; exit 1; }
    meson compile -C "$work/build"
    "$work/build/consumer"
    "$work/build/consumer_header_only"
    ;;
  pkg_config)
    install_library
    PKG_CONFIG_PATH=$(dirname "$(find "$work/prefix" -name tensordict.pc)")
    export PKG_CONFIG_PATH
    for package in tensordict tensordict-header-only; do
      echo "pkg-config --cflags --libs $package: $(pkg-config --cflags --libs $package)"
      # shellcheck disable=SC2046
      c++ -O1 "$here/main.cpp" -o "$work/consumer-$package" $(pkg-config --cflags --libs $package)
      "$work/consumer-$package"
    done
    ;;
  cmake)
    install_library
    cmake -S "$here/cmake" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCONSUMER_MAIN="$here/main.cpp" \
      -DCMAKE_BUILD_TYPE=Release
    cmake --build "$work/cmake-build"
    "$work/cmake-build/consumer"
    "$work/cmake-build/consumer_header_only"
    ;;
  *)
    echo "unknown way to consume: $how" >&2
    exit 2
    ;;
esac
