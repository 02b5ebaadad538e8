#!/usr/bin/env bash
# The device's CuPy kernel cache, kept here between device calls (device_pending.sh carries it there and brings each
# call's new builds back as $OUT/kcache.tgz). Run from the repository root:
#   bash benchmarks/kcache.sh merge ARCHIVE...   add the builds of each archive to .kcache.tgz (carry it in run()),
#                                                keeping the newest builds within KCACHE_MIB MiB (default 96)
#   bash benchmarks/kcache.sh list               the builds .kcache.tgz holds, newest first, and its size
# A build is named by CuPy from its source, options and NVRTC version, so stale builds are harmless; the budget only
# keeps the carried archive well inside the 64 MiB a call's tree may hold. KCACHE names another archive (tests).
set -eu
archive="$(realpath -m "${KCACHE:-.kcache.tgz}")"
budget=$(( ${KCACHE_MIB:-96} * 1024 * 1024 ))
case "${1:-}" in
  merge)
    shift
    [ $# -gt 0 ] || { echo "kcache.sh merge: name at least one archive (FILES_AT/kcache.tgz)" >&2; exit 2; }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    [ -f "$archive" ] && tar xzf "$archive" -C "$work"
    for a in "$@"; do
      [ -f "$a" ] || { echo "kcache.sh merge: no archive $a" >&2; exit 2; }
      tar xzf "$a" -C "$work" --touch  # (a build brought back now counts as the newest)
    done
    total=0 kept=0 dropped=0
    : > "$work/.keep"
    while read -r size name; do
      if [ $((total + size)) -le "$budget" ]; then
        total=$((total + size)) kept=$((kept + 1))
        echo "$name" >> "$work/.keep"
      else
        dropped=$((dropped + 1))
      fi
    done < <(cd "$work" && find . -maxdepth 1 -type f -name "*.cubin" -printf "%T@ %s %P\n" | sort -rn \
        | cut -d' ' -f2-)
    (cd "$work" && tar czf "$archive.new" -T .keep)
    mv "$archive.new" "$archive"
    echo "kcache: $kept builds ($((total / 1024)) KiB) in $archive, $(( $(stat -c %s "$archive") / 1024 )) KiB" \
         "compressed; $dropped older ones dropped"
    ;;
  list)
    [ -f "$archive" ] || { echo "kcache: no $archive"; exit 0; }
    tar tvzf "$archive" | sort -k4,5r
    echo "kcache: $(tar tzf "$archive" | wc -l) builds, $(( $(stat -c %s "$archive") / 1024 )) KiB"
    ;;
  *)
    echo "usage: bash benchmarks/kcache.sh merge ARCHIVE... | list" >&2
    exit 2
    ;;
esac
