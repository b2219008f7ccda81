#!/bin/sh
# Installs libpmhash under PREFIX: lib/libpmhash.so, lib/libpmhash.a,
# include/pmhash.h and lib/pkgconfig/pmhash.pc.
#
#     cargo rustc --release -p pmhash-ffi --lib --crate-type cdylib,staticlib
#     sh crates/ffi/install.sh PREFIX [BUILD_DIR]
#
# BUILD_DIR is where cargo put the libraries (default: target/release of
# the workspace). Cargo names them after the crate's lib, pmhash_ffi; they
# are installed as libpmhash (the shared library's SONAME is libpmhash.so).
set -eu
[ $# -ge 1 ] || { echo "usage: $0 PREFIX [BUILD_DIR]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
prefix=$1
build=${2:-$here/../../target/release}
# The version: the crate's own (a packaged crate), else the workspace's.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -n1)
[ -n "$version" ] || version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/../../Cargo.toml" | head -n1)
for f in libpmhash_ffi.so libpmhash_ffi.a; do
  [ -f "$build/$f" ] || { echo "$build/$f is missing: run cargo rustc --release -p pmhash-ffi --lib --crate-type cdylib,staticlib" >&2; exit 1; }
done
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
cp "$build/libpmhash_ffi.so" "$prefix/lib/libpmhash.so"
cp "$build/libpmhash_ffi.a" "$prefix/lib/libpmhash.a"
cp "$here/include/pmhash.h" "$prefix/include/pmhash.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$here/pmhash.pc.in" > "$prefix/lib/pkgconfig/pmhash.pc"
echo "installed libpmhash $version under $prefix"
