package checkpoint

// The commands run in the sandbox. Each is `sh -c SCRIPT sh ARGS...`; the
// work tree is $1. They use only git, tar, find, grep, xargs and sh.

// probeScript prints the repository state, one "key value" line each, and
// the hash of the full work tree: a copy of the index ($gitdir/
// hangar-tree-index.$3) gets `add -A` (tracked plus untracked files
// .gitignore does not ignore, with modes and symlinks) and `write-tree`.
// The copy keeps the index's stat cache, so only changed files are read.
// It is left in place for the patch part (patchScript removes it) and
// removed if the probe fails. With $4 (the previous checkpoint's HEAD) it
// says whether that commit is an ancestor of HEAD. The real index's content
// is not changed (its stat cache is refreshed).
const probeScript = `set -e
cd "$1"
[ "$(git rev-parse --is-inside-work-tree 2>/dev/null)" = true ] || { echo "not a git work tree" >&2; exit 10; }
[ "$(git rev-parse --show-prefix)" = "" ] || { echo "not the top of the work tree" >&2; exit 10; }
echo "head $(git rev-parse --verify -q HEAD || echo none)"
echo "branch $(git symbolic-ref -q HEAD || echo -)"
echo "base $(git rev-parse --verify -q "$2^{commit}" || echo missing)"
gitdir="$(git rev-parse --absolute-git-dir)"
echo "gitdir $gitdir"
git for-each-ref --format='ref %(objectname) %(refname)' refs/heads/
tmp="$gitdir/hangar-tree-index.$3"
ok=0
trap '[ "$ok" = 1 ] || rm -f "$tmp"' EXIT
idx="$(git rev-parse --git-path index)"
# Refresh the real index's stat cache first (what git status does; content
# is not changed): its entries then read as clean without rehashing, so a
# capture reads only what changed. Best effort: a held index lock is fine.
git update-index -q --refresh >/dev/null 2>&1 || true
# -p keeps the index mtime: git trusts its stat cache only for entries
# older than the index file (racy-git), so a fresh mtime would hide edits
# made within the same second as the last index write.
if [ -f "$idx" ]; then cp -p "$idx" "$tmp"; fi
GIT_INDEX_FILE="$tmp" git add -A
echo "tree $(GIT_INDEX_FILE="$tmp" git write-tree)"
if [ -n "$4" ]; then
  if git merge-base --is-ancestor "$4" HEAD 2>/dev/null; then echo "ancestor yes"; else echo "ancestor no"; fi
fi
echo "treeindex $tmp"
ok=1
`

// patchScript runs a git command ($2...) over the index copy $1 that
// probeScript left, then removes it.
const patchScript = `tmp="$1"; shift
trap 'rm -f "$tmp"' EXIT
GIT_INDEX_FILE="$tmp" "$@"
`

// treeScript prints the full work tree's hash, as probeScript does.
const treeScript = `set -e
cd "$1"
tmp="$(git rev-parse --absolute-git-dir)/hangar-tree-index.$$"
trap 'rm -f "$tmp"' EXIT
idx="$(git rev-parse --git-path index)"
# Refresh the real index's stat cache first (what git status does; content
# is not changed): its entries then read as clean without rehashing, so a
# capture reads only what changed. Best effort: a held index lock is fine.
git update-index -q --refresh >/dev/null 2>&1 || true
# -p keeps the index mtime: git trusts its stat cache only for entries
# older than the index file (racy-git), so a fresh mtime would hide edits
# made within the same second as the last index write.
if [ -f "$idx" ]; then cp -p "$idx" "$tmp"; fi
GIT_INDEX_FILE="$tmp" git add $2
GIT_INDEX_FILE="$tmp" git write-tree
`

// bundleScript writes a bundle of HEAD and the branches to stdout, minus
// what the commits in $HANGAR_EXCLUDE (base, previous checkpoint) reach;
// it exits 3 when that is nothing.
const bundleScript = `set -e
cd "$1"; shift
for c in $HANGAR_EXCLUDE; do
  if git cat-file -e "$c^{commit}" 2>/dev/null; then set -- "$@" "^$c"; fi
done
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
  git ls-files -z --others --exclude-standard --directory | grep -z '/$' | xargs -0 -r sh -c '
    for d; do
      if [ -e "$d.git" ]; then find "./$d" -print0; else
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
if [ -s "$st/index.diff" ]; then git apply --cached --binary "$st/index.diff"; fi
if [ -s "$st/worktree.diff" ]; then git apply --binary "$st/worktree.diff"; fi
`

// symlinkScript lists the symbolic links in the work tree (outside .git).
const symlinkScript = `cd "$1" && find . -path ./.git -prune -o -type l -print0`

// untarScript unpacks a checked tarball (from $2) into $1, keeping modes.
const untarScript = `cd "$1" && tar -x -p --no-same-owner -f "$2"`
