package checkpoint

// The commands run in the sandbox. Each is `sh -c SCRIPT sh ARGS...`; the
// work tree is $1. They use only git, tar, find, grep, xargs and sh.

// probeScript prints the repository state, one "key value" line each, and
// the two tree hashes: of tracked files (a copy of the index refreshed
// with `add -u`) and of the full work tree (then `add -A`: tracked plus
// untracked files .gitignore does not ignore, with modes and symlinks).
// The real index is not touched.
const probeScript = `set -e
cd "$1"
[ "$(git rev-parse --is-inside-work-tree 2>/dev/null)" = true ] || { echo "not a git work tree" >&2; exit 10; }
[ "$(git rev-parse --show-prefix)" = "" ] || { echo "not the top of the work tree" >&2; exit 10; }
echo "head $(git rev-parse --verify -q HEAD || echo none)"
echo "branch $(git symbolic-ref -q HEAD || echo -)"
echo "base $(git rev-parse --verify -q "$2^{commit}" || echo missing)"
echo "gitdir $(git rev-parse --absolute-git-dir)"
git for-each-ref --format='ref %(objectname) %(refname)' refs/heads/
tmp="$(git rev-parse --absolute-git-dir)/hangar-tree-index.$$"
trap 'rm -f "$tmp"' EXIT
idx="$(git rev-parse --git-path index)"
if [ -f "$idx" ]; then cp "$idx" "$tmp"; fi
GIT_INDEX_FILE="$tmp" git add -u
echo "tracked $(GIT_INDEX_FILE="$tmp" git write-tree)"
GIT_INDEX_FILE="$tmp" git add -A
echo "tree $(GIT_INDEX_FILE="$tmp" git write-tree)"
`

// treeScript prints the full work tree's hash, as probeScript does.
const treeScript = `set -e
cd "$1"
tmp="$(git rev-parse --absolute-git-dir)/hangar-tree-index.$$"
trap 'rm -f "$tmp"' EXIT
idx="$(git rev-parse --git-path index)"
if [ -f "$idx" ]; then cp "$idx" "$tmp"; fi
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
// (for their modes) and the empty directories under them, and untracked nested repositories whole.
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
