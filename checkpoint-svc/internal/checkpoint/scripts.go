package checkpoint

// The commands run in the sandbox. Each is `sh -c SCRIPT sh ARGS...`; the
// work tree is $1. They use only git, tar, find, grep, xargs and sh.

// probeScript prints the repository state, one "key value" line each, and
// two trees written from copies of the index ($gitdir/hangar-tree-index.$3,
// removed before it exits): "itree", the index's own content ("-" when it
// has no tree, e.g. unmerged entries), and "tree", the full work tree
// (tracked plus untracked files .gitignore does not ignore, with modes and
// symlinks) after `add -A`. Every part of the capture is then a diff
// between trees, which costs what changed, not what the tree holds. The
// copy keeps the index's stat cache (and, by `cp -p`, its mtime: git trusts
// its stat cache only for entries older than the index file, so a fresh
// mtime would hide edits made within the same second as the last index
// write), so only changed files are read. With $4 (the previous
// checkpoint's HEAD) it says whether that commit is an ancestor of HEAD.
//
// Entries the index recorded in the same second it was written ("racily
// clean", e.g. everything a checkout or a restore wrote) are read again by
// every capture until the index is written in a later second, so the
// probe refreshes the real index's stat cache (what git status does;
// content is not changed) unless $gitdir/hangar-index-stamp says the index
// is still the one an earlier refresh left with no such entries. The
// refresh is best effort and never changes what is captured.
const probeScript = `set -e
cd "$1"; nonce="$3"; prev="$4"
# Few processes: on a busy machine each costs more than git's work here.
loc="$(git rev-parse --is-inside-work-tree --show-prefix --absolute-git-dir --git-path index 2>/dev/null)" || { echo "not a git work tree" >&2; exit 10; }
{ read -r inside; read -r prefix; read -r gitdir; read -r idx; } <<EOF
$loc
EOF
[ "$inside" = true ] || { echo "not a git work tree" >&2; exit 10; }
[ -z "$prefix" ] || { echo "not the top of the work tree" >&2; exit 10; }
case "$idx" in /*) ;; *) idx="$PWD/$idx" ;; esac
{ read -r head htype; read -r base btype; } <<EOF
$(printf '%s\n' HEAD "$2^{commit}" | git cat-file --batch-check='%(objectname) %(objecttype)')
EOF
[ "$htype" = commit ] || head=none
[ "$btype" = commit ] || base=missing
echo "head $head"
echo "branch $(git symbolic-ref -q HEAD || echo -)"
echo "base $base"
echo "gitdir $gitdir"
git for-each-ref --format='ref %(objectname) %(refname)' refs/heads/
tmp="$gitdir/hangar-tree-index.$nonce"
trap 'rm -f "$tmp"' EXIT
stamp="$gitdir/hangar-index-stamp"
if [ -f "$idx" ]; then
  before="$(stat -c '%i %s %Y %y' "$idx")"
  saved=""
  if [ -f "$stamp" ]; then read -r saved < "$stamp" || true; fi
  if [ "$before" != "$saved" ]; then
    rm -f "$stamp"
    if git update-index -q --refresh >/dev/null 2>&1 || [ $? = 1 ]; then
      after="$(stat -c '%i %s %Y %y' "$idx")"
      set -- $before; bsec="$3"
      set -- $after; asec="$3"
      # Written in a later second than before (or not at all): no entry
      # is racily clean.
      if [ "$after" = "$before" ] || [ "$asec" -gt "$bsec" ]; then
        printf '%s\n' "$after" > "$stamp" || true
      fi
    fi
  fi
  cp -p "$idx" "$tmp"
fi
echo "itree $(GIT_INDEX_FILE="$tmp" git write-tree 2>/dev/null || echo -)"
GIT_INDEX_FILE="$tmp" git add -A
echo "tree $(GIT_INDEX_FILE="$tmp" git write-tree)"
if [ -n "$prev" ]; then
  if git merge-base --is-ancestor "$prev" HEAD 2>/dev/null; then echo "ancestor yes"; else echo "ancestor no"; fi
fi
`

// treeScript prints the hash of the work tree as `git add $2` into a copy
// of the index sees it (-A: the full work tree, as probeScript; -u: the
// tracked files only).
const treeScript = `set -e
cd "$1"
tmp="$(git rev-parse --absolute-git-dir)/hangar-tree-index.$$"
trap 'rm -f "$tmp"' EXIT
idx="$(git rev-parse --git-path index)"
# -p keeps the index mtime (see probeScript).
if [ -f "$idx" ]; then cp -p "$idx" "$tmp"; fi
GIT_INDEX_FILE="$tmp" git add $2
GIT_INDEX_FILE="$tmp" git write-tree
`

// bundleScript writes a bundle of HEAD and the branches to stdout, minus
// what the commits in $HANGAR_EXCLUDE (base, previous checkpoint) reach;
// it exits 3 when that is nothing.
const bundleScript = `set -e
cd "$1"; shift
excl=""
while read -r sha typ; do
  if [ "$typ" = commit ]; then excl="$excl ^$sha"; fi
done <<EOF
$(for c in $HANGAR_EXCLUDE; do printf '%s^{commit}\n' "$c"; done | git cat-file --batch-check='%(objectname) %(objecttype)')
EOF
set -- "$@" $excl
[ -n "$(git rev-list -n 1 "$@")" ] || exit 3
git bundle create -q - "$@"
`

// untrackedScript writes a tarball of the untracked files .gitignore does
// not ignore: every such file (symlinks as links), untracked directories
// (for their modes) and the empty directories under them, untracked
// nested repositories whole, and directories left empty by deleted (not
// yet staged) tracked files, which applying the diff would remove.
// Names go NUL-separated and verbatim, so any byte is fine.
const untrackedScript = `set -e
cd "$1"
{
  git ls-files -z --others --exclude-standard
  git ls-files -z --others --exclude-standard | grep -z '/$' | xargs -0 -r sh -c 'for d; do find "./$d" -mindepth 1 -print0; done' sh
  git ls-files -z --others --exclude-standard --directory | grep -z '/$' | xargs -0 -r sh -c '
    for d; do
      if [ ! -e "$d.git" ]; then
        find "./$d" -maxdepth 0 -print0; find "./$d" -mindepth 1 -type d -empty -print0
      fi
    done' sh
  git ls-files -z --deleted | xargs -0 -r sh -c '
    for f; do d="$(dirname -- "$f")"
      while [ "$d" != . ]; do
        if [ -d "$d" ] && [ ! -L "$d" ] && [ -z "$(ls -A -- "$d")" ]; then printf "%s\0" "$d"; fi
        d="$(dirname -- "$d")"
      done
    done' sh
} | tar -c -f - --format=gnu --null --verbatim-files-from --no-recursion -T -
`

// untrackedTreeScript writes the same tarball as untrackedScript, taking
// the untracked files and the deleted tracked ones from the diff of the
// index's tree ($2) and the work tree's ($3) instead of scans: only the
// scan for untracked directories (their modes and empty ones) still lists
// the work tree's directories. $4... are the untracked repositories inside
// the work tree, which go whole.
const untrackedTreeScript = `set -e
cd "$1"; i="$2"; w="$3"; shift 3
{
  git diff-tree -r -z --no-renames --name-only --diff-filter=A "$i" "$w"
  for d; do find "./$d" -mindepth 1 -print0; done
  git ls-files -z --others --exclude-standard --directory | grep -z '/$' | xargs -0 -r sh -c '
    for d; do
      if [ ! -e "$d.git" ]; then
        find "./$d" -maxdepth 0 -print0; find "./$d" -mindepth 1 -type d -empty -print0
      fi
    done' sh
  git diff-tree -r -z --no-renames --name-only --diff-filter=D "$i" "$w" | xargs -0 -r sh -c '
    for f; do d="$(dirname -- "$f")"
      while [ "$d" != . ]; do
        if [ -d "$d" ] && [ ! -L "$d" ] && [ -z "$(ls -A -- "$d")" ]; then printf "%s\0" "$d"; fi
        d="$(dirname -- "$d")"
      done
    done' sh
} | tar -c -f - --format=gnu --null --verbatim-files-from --no-recursion -T -
`

// changesScript lists, NUL-separated, what changed between HEAD ($2), the
// index's tree ($3) and the work tree's ($4): a section name ("HI", "HW",
// "IW"), then that pair's `git diff-tree --raw` entries (":modes hashes
// status", path). Tree diffs read only the trees along changed paths.
const changesScript = `set -e
cd "$1"
for pair in "HI $2 $3" "HW $2 $4" "IW $3 $4"; do
  set -- $pair
  printf '%s\0' "$1"
  git diff-tree -r -z --no-renames --raw "$2" "$3"
done
`

// stageScript writes stdin to the file $1.
const stageScript = `cat > "$1"`

// restoreScript rebuilds the repository state in work tree $1 from the
// staged parts in $2: unbundle the chain in order, set the branches, check
// out HEAD, drop untracked files the sandbox had, apply the index and the
// work tree diffs. $3 is the branch to check out ("-" for a detached HEAD)
// and $4 the commit.
const restoreScript = `set -e
cd "$1"; st="$2"
for b in "$st"/bundle-*; do
  [ -e "$b" ] || continue
  git bundle unbundle "$b" >/dev/null
done
while read -r sha ref; do git update-ref "$ref" "$sha"; done < "$st/refs"
if [ "$3" = "-" ]; then git checkout -q -f --detach "$4"; else git checkout -q -f -B "$3" "$4"; fi
git clean -q -f -d
# A diff may hold no patch, only lines like "* Unmerged path x".
if grep -q '^diff --git ' "$st/index.diff" 2>/dev/null; then git apply --cached --binary "$st/index.diff"; fi
if grep -q '^diff --git ' "$st/worktree.diff" 2>/dev/null; then git apply --binary "$st/worktree.diff"; fi
`

// symlinkScript lists the symbolic links in the work tree (outside .git).
const symlinkScript = `cd "$1" && find . -path ./.git -prune -o -type l -print0`

// untarScript unpacks a checked tarball (from $2) into $1, keeping modes.
const untarScript = `cd "$1" && tar -x -p --no-same-owner -f "$2"`
