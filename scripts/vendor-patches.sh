#!/usr/bin/env bash
# Herald's patched copies of upstream crates (vendor/README.md says why each exists). Each copy is
# the crate as published on crates.io plus one patch file, vendor/patches/<crate>-<version>.patch,
# with the crate's examples, benches, tests, lock file and dev-dependencies left out ("trimmed",
# so that the workspace never builds them). The patch files are the source of truth:
#
#   scripts/vendor-patches.sh apply [CRATE...]   rebuild vendor/<crate> = published + patch, trimmed
#   scripts/vendor-patches.sh check [CRATE...]   fail unless vendor/<crate> is exactly that (CI)
#   scripts/vendor-patches.sh diff CRATE         rewrite the patch from an edited vendor/<crate>
#   scripts/vendor-patches.sh test [CRATE...]    the published crate's own tests on the patched,
#                                                untrimmed copy, with Herald's features (CI)
#   scripts/vendor-patches.sh unused [MANIFEST]  fail if a [patch] of MANIFEST (default: the
#                                                workspace's Cargo.toml) is unused (CI)
#   scripts/vendor-patches.sh selftest           tests of `check` and `unused` themselves (CI)
#
# To change a patched crate: edit vendor/<crate>, run `diff CRATE`, commit both. To move to a new
# upstream version: rename the patch file to the new version, run `apply CRATE` (fix the patch if
# a hunk no longer applies) and update Cargo.lock (`cargo update -p CRATE`).
#
# The published .crate comes from cargo's own download cache (cargo checked its checksum against
# the registry index); if it is not there, cargo fetches it through a throwaway manifest.
# Needs: cargo, git (for `git apply`), tar, diff.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
patches=vendor/patches
cargo_home=${CARGO_HOME:-$HOME/.cargo}
# Build products of `test`, kept between runs so that CI rebuilds only what changed.
test_target=${HERALD_VENDOR_TEST_TARGET:-$HOME/.cache/herald/vendor-test-target}

# What `test` runs for each crate, with Herald's features (the workspace Cargo.toml and
# crates/server/Cargo.toml), so that the tests exercise the code Herald runs. tokio-websockets:
# every test the published crate has (unit, tests/, doc). rustls: its doc tests only; the
# published crate leaves out the testdata/ and test-ca/ files its unit tests `include_bytes!`, so
# those do not compile from it (vendor/README.md).
test_args() {
  case $1 in
    tokio-websockets) echo "--features server,client,sha1_smol,fastrand" ;;
    rustls) echo "--doc --no-default-features --features ring,std,tls12,logging" ;;
    *) echo "" ;;
  esac
}

die() {
  echo "vendor-patches: $*" >&2
  exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/herald-vendor.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The patched crates, "name version" per line, from the patch files' names.
crates() {
  local p base
  for p in "$patches"/*.patch; do
    [ -e "$p" ] || continue
    base=$(basename "$p" .patch)
    echo "${base%-*} ${base##*-}"
  done
}

# version_of CRATE: the patched version of CRATE (from its patch file's name).
version_of() {
  local name version
  while read -r name version; do
    if [ "$name" = "$1" ]; then
      echo "$version"
      return
    fi
  done < <(crates)
  die "no patch file for '$1' in $patches/ (have: $(crates | cut -d' ' -f1 | tr '\n' ' '))"
}

# crate_file NAME VERSION: the path of the published .crate, fetched by cargo if not cached.
crate_file() {
  local name=$1 version=$2 found
  found=$(compgen -G "$cargo_home/registry/cache/*/$name-$version.crate" | head -n1 || true)
  if [ -z "$found" ]; then
    local m="$work/fetch-$name"
    mkdir -p "$m/src"
    : >"$m/src/lib.rs"
    printf '[package]\nname = "herald-vendor-fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\n%s = { version = "=%s", default-features = false }\n' \
      "$name" "$version" >"$m/Cargo.toml"
    cargo fetch --quiet --manifest-path "$m/Cargo.toml" >&2
    found=$(compgen -G "$cargo_home/registry/cache/*/$name-$version.crate" | head -n1 || true)
    [ -n "$found" ] || die "cargo fetched $name $version but its .crate is not under $cargo_home/registry/cache/"
  fi
  echo "$found"
}

# unpack NAME VERSION DEST: the published crate, unchanged, into DEST.
unpack() {
  local file
  file=$(crate_file "$1" "$2")
  mkdir -p "$work/unpack"
  rm -rf "$work/unpack/$1-$2"
  tar -xzf "$file" -C "$work/unpack"
  mv "$work/unpack/$1-$2" "$3"
}

# trim DIR: leave out what Herald never builds (examples, benches, tests and their data, the lock
# file, cargo's packaging notes, dev-dependencies and the example/bench/test targets).
trim() {
  local dir=$1
  rm -rf "$dir"/{.cargo_vcs_info.json,.clippy.toml,Cargo.lock,Cargo.toml.orig}
  rm -rf "$dir"/{autobahn,benches,examples,scripts,tests}
  # A section runs from its header to the next header; cargo writes published manifests this way.
  awk '
    /^\[/ { skip = ($0 ~ /^\[\[(example|bench|test)\]\]$/ || $0 ~ /^\[(target\..*\.)?dev-dependencies[.\]]/) }
    !skip { print }
  ' "$dir/Cargo.toml" >"$dir/Cargo.toml.trimmed"
  mv "$dir/Cargo.toml.trimmed" "$dir/Cargo.toml"
}

# patch_into DIR PATCH: apply PATCH (paths with one leading component) to DIR; fails on any hunk
# that does not apply.
patch_into() {
  (cd "$1" && git apply -p1 "$root/$2") || die "$2 does not apply to the published crate"
}

# build NAME VERSION DEST [untrimmed]: published + patch (+ trimmed unless asked not to).
build() {
  local name=$1 version=$2 dest=$3
  unpack "$name" "$version" "$dest"
  patch_into "$dest" "$patches/$name-$version.patch"
  [ "${4:-}" = untrimmed ] || trim "$dest"
}

# The crates named on the command line (all when none), "name version" per line, in $selected.
# (Set here, not printed to a pipe, so that an unknown name stops the script.)
select_crates() {
  local c v
  selected=""
  if [ $# -eq 0 ]; then
    selected=$(crates)
  else
    for c in "$@"; do
      v=$(version_of "$c")
      selected+="$c $v"$'\n'
    done
  fi
  [ -n "$selected" ] || die "no patch files in $patches/"
}

cmd_apply() {
  local name version
  select_crates "$@"
  while read -r name version; do
    [ -n "$name" ] || continue
    build "$name" "$version" "$work/$name"
    rm -rf "vendor/$name"
    mv "$work/$name" "vendor/$name"
    echo "vendor/$name: $name $version from crates.io + $patches/$name-$version.patch"
  done <<<"$selected"
}

cmd_check() {
  local name version status=0
  select_crates "$@"
  while read -r name version; do
    [ -n "$name" ] || continue
    build "$name" "$version" "$work/$name"
    if diff -r "$work/$name" "vendor/$name" >"$work/$name.diff"; then
      echo "vendor/$name: equals $name $version + $patches/$name-$version.patch"
    else
      echo "vendor/$name differs from $name $version + $patches/$name-$version.patch" \
        "(edited without updating the patch? run: scripts/vendor-patches.sh diff $name):" >&2
      sed "s|$work/|upstream+patch: |" "$work/$name.diff" >&2
      status=1
    fi
  done <<<"$selected"
  return "$status"
}

# `diff -ruN` with the file dates left out (so that the patch changes only when the code does);
# a file that one side lacks is /dev/null, which `git apply` reads as a creation or deletion.
stable_diff() {
  (cd "$1" && TZ=UTC diff -ruN "$2" "$3") |
    sed -E '/^(---|\+\+\+) /{s/^(---|\+\+\+) [^\t]*\t1970-01-01 00:00:00(\.0+)? \+0000$/\1 \/dev\/null/;s/\t.*$//}'
}

cmd_diff() {
  [ $# -eq 1 ] || die "usage: diff CRATE"
  local name=$1 version
  version=$(version_of "$name")
  # The patch applies to the untrimmed crate: first the edits against the trimmed copy, carried
  # over to the untrimmed one, then the untrimmed diff.
  unpack "$name" "$version" "$work/upstream"
  cp -r "$work/upstream" "$work/trimmed"
  trim "$work/trimmed"
  cp -r "vendor/$name" "$work/vendor"
  stable_diff "$work" trimmed vendor >"$work/trimmed.patch" || true
  cp -r "$work/upstream" "$work/patched"
  (cd "$work/patched" && git apply -p1 "$work/trimmed.patch")
  stable_diff "$work" upstream patched >"$patches/$name-$version.patch" || true
  cmd_check "$name"
  echo "wrote $patches/$name-$version.patch"
}

cmd_test() {
  local name version status=0
  local src
  mkdir -p "$test_target"
  select_crates "$@"
  while read -r name version; do
    [ -n "$name" ] || continue
    # The same folder every run, so that cargo reuses what it built for it (a new path would be a
    # new package to cargo, and the target folder would grow every run).
    src="$test_target.src/$name"
    rm -rf "$src"
    mkdir -p "$(dirname "$src")"
    build "$name" "$version" "$src" untrimmed
    # Its own workspace, wherever the folder is (never a member of Herald's, never patched).
    printf '\n[workspace]\n' >>"$src/Cargo.toml"
    echo "== $name $version + patch: cargo test $(test_args "$name")"
    # No --locked: the crate's own Cargo.lock pins its dev-dependencies, and cargo adds only what
    # the patch adds (tokio-websockets: flate2).
    # shellcheck disable=SC2046
    CARGO_TARGET_DIR="$test_target" cargo test --quiet --manifest-path "$src/Cargo.toml" \
      $(test_args "$name") || status=1
  done <<<"$selected"
  return "$status"
}

# Cargo's warning for a [patch] entry that matches nothing in the resolved graph.
unused_warning='was not used in the crate graph'

cmd_unused() {
  local manifest=${1:-Cargo.toml} log="$work/metadata.stderr" found
  # cargo metadata resolves the whole graph (every target, feature and platform) against the
  # committed Cargo.lock; a failure here is a failure of the check, not a pass.
  if ! cargo metadata --format-version 1 --locked --manifest-path "$manifest" >/dev/null 2>"$log"; then
    cat "$log" >&2
    die "cargo metadata failed for $manifest"
  fi
  found=$(grep -A3 "$unused_warning" "$log" || true)
  if [ -n "$found" ]; then
    echo "$manifest has a [patch] that cargo does not use (Cargo.lock moved to another version," \
      "or the crate left the graph): rebase the patch on the locked version or drop it" \
      "(vendor/README.md):" >&2
    echo "$found" >&2
    return 1
  fi
  echo "$manifest: every [patch] is used"
}

# The checks above, run on cases where the answer is known.
cmd_selftest() {
  local ws="$work/selftest" failed=0
  # A workspace with a path crate `dep` from crates.io's name space, patched; `user` depends on
  # it only when the case says so.
  mkdir -p "$ws/dep/src" "$ws/user/src"
  printf '[package]\nname = "herald-selftest-dep"\nversion = "0.1.0"\nedition = "2021"\n' \
    >"$ws/dep/Cargo.toml"
  : >"$ws/dep/src/lib.rs"
  : >"$ws/user/src/lib.rs"
  local uses
  for uses in yes no; do
    {
      printf '[package]\nname = "herald-selftest-user"\nversion = "0.1.0"\nedition = "2021"\n'
      printf '[dependencies]\n'
      [ "$uses" = no ] || printf 'herald-selftest-dep = "0.1"\n'
    } >"$ws/user/Cargo.toml"
    {
      printf '[workspace]\nmembers = ["user"]\nresolver = "2"\n'
      printf '[patch.crates-io]\nherald-selftest-dep = { path = "dep" }\n'
    } >"$ws/Cargo.toml"
    rm -f "$ws/Cargo.lock"
    # The lock file `unused` runs against (--locked), made as `cargo build` would.
    cargo generate-lockfile --offline --quiet --manifest-path "$ws/Cargo.toml" 2>/dev/null
    if [ "$uses" = yes ]; then
      if cmd_unused "$ws/Cargo.toml" >/dev/null 2>&1; then
        echo "selftest ok: unused passes a used [patch]"
      else
        echo "selftest FAILED: unused rejected a used [patch]" >&2
        failed=1
      fi
    elif cmd_unused "$ws/Cargo.toml" >/dev/null 2>&1; then
      echo "selftest FAILED: unused missed an unused [patch]" >&2
      failed=1
    else
      echo "selftest ok: unused fails on an unused [patch]"
    fi
  done

  # `check` on a copy of the tree whose vendored crate was edited: must fail, and pass again once
  # the edit is undone. The copy holds only what the script reads.
  local name version copy="$work/selftest-tree"
  read -r name version < <(crates)
  mkdir -p "$copy/scripts" "$copy/vendor"
  cp scripts/vendor-patches.sh "$copy/scripts/"
  cp -r "$patches" "$copy/vendor/"
  cp -r "vendor/$name" "$copy/vendor/"
  echo "// an edit the patch does not have" >>"$copy/vendor/$name/src/lib.rs"
  if bash "$copy/scripts/vendor-patches.sh" check "$name" >/dev/null 2>&1; then
    echo "selftest FAILED: check passed an edited vendor/$name" >&2
    failed=1
  else
    echo "selftest ok: check fails on an edited vendor/$name"
  fi
  cp "vendor/$name/src/lib.rs" "$copy/vendor/$name/src/lib.rs"
  if bash "$copy/scripts/vendor-patches.sh" check "$name" >/dev/null 2>&1; then
    echo "selftest ok: check passes the committed vendor/$name"
  else
    echo "selftest FAILED: check rejected the committed vendor/$name" >&2
    failed=1
  fi
  return "$failed"
}

[ $# -ge 1 ] || die "usage: $0 apply|check|diff|test|unused|selftest [ARGS...]"
command=$1
shift
case $command in
  apply | check | diff | test | unused | selftest) "cmd_$command" "$@" ;;
  *) die "unknown command '$command' (apply|check|diff|test|unused|selftest)" ;;
esac
