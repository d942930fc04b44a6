#!/usr/bin/env bash
# check_exports.sh LIB EXPORTS_DEF PROGRAM...
# The library exports exactly the functions of exports.def (the real libcudart.so.13's), each
# with the libcudart.so.13 version node, and every cuda*/__cuda* symbol the programs import
# is one of them (so LD_PRELOAD satisfies all of them, without "no version information").
set -u -o pipefail
lib=$1 def=$2; shift 2
fail=0
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT

grep -oE '^[XS]\(([A-Za-z0-9_]+)' "$def" | sed 's/^..//' | LC_ALL=C sort >"$work/want"
readelf --dyn-syms -W "$lib" | awk '$4 == "FUNC" && $7 != "UND" { print $8 }' | LC_ALL=C sort >"$work/have"
if grep -v '@@libcudart\.so\.13$' "$work/have" >"$work/unversioned"; then
  echo "exported without the libcudart.so.13 version node:"; cat "$work/unversioned"; fail=1
fi
sed 's/@.*//' "$work/have" | LC_ALL=C sort >"$work/names"
if ! diff -u --label expected --label exported "$work/want" "$work/names"; then
  echo "the library's functions differ from exports.def"; fail=1
fi
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == libcudart.so.13 ]] || { echo "SONAME is '$soname', not libcudart.so.13"; fail=1; }

for prog in "$@"; do
  [[ -x $prog ]] || { echo "program not built: $prog"; fail=1; continue; }
  nm -D --undefined-only "$prog" | awk '{ print $2 }' | grep -E '^_?_?cuda' | sort -u >"$work/imports"
  while read -r sym; do
    name=${sym%@*} version=${sym#*@}
    [[ $sym == *@* && $version != libcudart.so.13 ]] && { echo "$(basename "$prog"): $sym wants version $version"; fail=1; }
    grep -qx "$name" "$work/names" || { echo "$(basename "$prog") imports $name, which the library does not export"; fail=1; }
  done <"$work/imports"
  echo "$(basename "$prog"): $(wc -l <"$work/imports") imports, all exported"
done
((fail == 0)) && echo "exports: $(wc -l <"$work/names") functions, all versioned libcudart.so.13"
exit $fail
