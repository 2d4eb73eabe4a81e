package checkpoint

// The commands run in the sandbox. Each is `sh -c SCRIPT sh ARGS...`; the
// work tree is $1. They use only git, tar, find, grep, xargs and sh.

// probeScript prints the repository state, one "key value" line each, then
// a line "changes" and what changed between HEAD's tree, the index's tree
// and the work tree's (below). It writes two trees from copies of the
// index ($gitdir/hangar-tree-index.$3, removed before it exits): "itree",
// the index's own content ("-" when it has none, e.g. unmerged entries),
// and "tree", the full work tree (tracked plus untracked files .gitignore
// does not ignore, with modes and symlinks) after `add -A`. Every part of
// the capture is then a diff between trees, which costs what changed, not
// what the tree holds. The copy keeps the index's stat cache (and, by
// `cp -p`, its mtime: git trusts its stat cache only for entries older
// than the index file, so a fresh mtime would hide edits made within the
// same second as the last index write), so only changed files are read.
// With $4 (the previous checkpoint's HEAD) it says whether that commit is
// an ancestor of HEAD. "untracked" lines (NUL-separated after "changes")
// come from the one scan of the work tree's directories, run alongside
// `add -A`: the untracked directories, for their modes and empty ones.
//
// Entries the index recorded in the same second it was written ("racily
// clean", e.g. everything a checkout or a restore wrote) are read again by
// every capture until the index is written in a later second, so the
// probe refreshes the real index's stat cache (what git status does;
// content is not changed) unless $gitdir/hangar-index-stamp, a hard link
// to the index an earlier refresh left with no such entries, is still the
// index. The refresh never changes what is captured. While the stamp holds,
// the index's tree is also the one recorded then ($stamp.tree), not
// written again.
//
// Each process costs milliseconds in a sandbox, so the probe runs as few
// as it can: on the common path rev-parse, cat-file, for-each-ref, ln,
// add, write-tree, ls-files, diff-tree and cat.
//
// After "changes": `git diff-tree --stdin --always -r -z --raw` of the
// pairs HEAD-index, HEAD-work tree, index-work tree (each pair's header
// line "a b\n", then its entries ":modes hashes status\0path\0"), then
// "\0untracked\0" and the ls-files output (NUL-separated), then "/ita\0"
// (no path starts with "/") and the index entries of the empty blob as
// `ls-files -s -z` prints them ("mode hash stage\tpath\0"): the
// intent-to-add entries are among them.
const probeScript = `set -e
cd "$1"; nonce="$3"; prev="$4"
loc="$(git rev-parse --is-inside-work-tree --show-prefix --absolute-git-dir --git-path index 2>/dev/null)" || { echo "not a git work tree" >&2; exit 10; }
{ read -r inside; read -r prefix; read -r gitdir; read -r idx; } <<EOF
$loc
EOF
[ "$inside" = true ] || { echo "not a git work tree" >&2; exit 10; }
[ -z "$prefix" ] || { echo "not the top of the work tree" >&2; exit 10; }
case "$idx" in /*) ;; *) idx="$PWD/$idx" ;; esac
stamp="$gitdir/hangar-index-stamp"
# The index's tree from an earlier probe, while the index is the same file
# (git never writes an index in place).
cached=-
if [ -f "$idx" ] && [ "$idx" -ef "$stamp" ] && [ -f "$stamp.tree" ]; then read -r cached < "$stamp.tree" || cached=-; fi
{ read -r head htype; read -r htree ttype; read -r base btype; read -r ctree ctype; } <<EOF
$(printf '%s\n' HEAD 'HEAD^{tree}' "$2^{commit}" "$cached^{tree}" | git cat-file --batch-check='%(objectname) %(objecttype)')
EOF
[ "$htype" = commit ] || head=none
[ "$btype" = commit ] || base=missing
echo "head $head"
echo "base $base"
echo "gitdir $gitdir"
git for-each-ref --format='ref %(objectname) %(refname) %(HEAD)' refs/heads/
[ "$head" != none ] && [ "$base" != missing ] || exit 0
tmp="$gitdir/hangar-tree-index.$nonce"
lst="$gitdir/hangar-untracked.$nonce"
trap 'rm -f "$tmp" "$lst"' EXIT
if [ -f "$idx" ]; then
  if ! [ "$idx" -ef "$stamp" ]; then
    rm -f "$stamp" "$stamp.pre" "$stamp.tree"
    ln "$idx" "$stamp.pre"
    bsec="$(stat -c %Y "$idx")"
    if git update-index -q --refresh >/dev/null 2>&1 || [ $? = 1 ]; then
      # Not rewritten, or rewritten in a later second: no entry is
      # racily clean.
      if [ "$idx" -ef "$stamp.pre" ] || [ "$(stat -c %Y "$idx")" -gt "$bsec" ]; then ln -f "$idx" "$stamp"; fi
    fi
    rm -f "$stamp.pre"
  fi
  # A hard link: git replaces an index file, never writes it in place, so
  # the real one is untouched, and its mtime comes along.
  ln "$idx" "$tmp" 2>/dev/null || cp -p "$idx" "$tmp"
fi
# The untracked scan, then the index's entries of the empty blob (an
# intent-to-add entry, git add -N, is one), into one file.
{
  git ls-files -z --others --exclude-standard --directory
  printf '/ita\0'
  git ls-files -s -z | grep -z '^[0-7]* e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0	' || true
} > "$lst" &
scan=$!
if [ "$ctype" = tree ] && [ "$tmp" -ef "$stamp" ]; then itree="$ctree"; else
  itree="$(GIT_INDEX_FILE="$tmp" git write-tree 2>/dev/null)" || itree=-
  if [ "$itree" != - ] && [ "$idx" -ef "$stamp" ]; then echo "$itree" > "$stamp.tree" || true; fi
fi
GIT_INDEX_FILE="$tmp" git add -A
tree="$(GIT_INDEX_FILE="$tmp" git write-tree)"
wait $scan
echo "itree $itree"
echo "tree $tree"
if [ -n "$prev" ]; then
  if [ "$prev" = "$head" ] || git merge-base --is-ancestor "$prev" HEAD 2>/dev/null; then echo "ancestor yes"; else echo "ancestor no"; fi
fi
[ "$itree" != - ] || exit 0
echo changes
printf '%s %s\n%s %s\n%s %s\n' "$htree" "$itree" "$htree" "$tree" "$itree" "$tree" | git diff-tree --stdin --always -r -z --raw --no-renames
printf '\0untracked\0'
cat "$lst"
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

// untrackedTreeScript writes the same tarball as untrackedScript from what
// the probe found, with no scan of its own: stdin holds the untracked
// files (NUL-separated; from the diff of the index's tree and the work
// tree's), then $2 and $3 count the paths that follow: $2 directories that
// lost tracked files (kept if now empty, which applying the diff would
// remove), $3 untracked repositories (whole), and the rest untracked
// directories (for their modes, with the empty directories under them).
// Paths start with "./". Three processes when there are no directories.
const untrackedTreeScript = `set -e
cd "$1"; ne="$2"; nr="$3"; shift 3
e=""; i=1
while [ "$i" -le "$ne" ]; do e="$e \"\${$i}\""; i=$((i+1)); done
r=""
while [ "$i" -le $((ne+nr)) ]; do r="$r \"\${$i}\""; i=$((i+1)); done
d=""
while [ "$i" -le $# ]; do d="$d \"\${$i}\""; i=$((i+1)); done
{
  cat
  if [ -n "$e" ]; then eval "find $e -maxdepth 0 -type d -empty -print0" 2>/dev/null || true; fi
  if [ -n "$r" ]; then eval "find $r -mindepth 1 -print0"; fi
  if [ -n "$d" ]; then eval "printf '%s\0' $d"; eval "find $d -mindepth 1 -type d -empty -print0"; fi
} | tar -c -f - --format=gnu --null --verbatim-files-from --no-recursion -T -
`

// stageScript writes stdin to the file $1.
const stageScript = `cat > "$1"`

// restoreScript rebuilds the repository state in work tree $1 from the
// staged parts in $2: unbundle the chain in order, set the branches, check
// out HEAD, drop untracked files the sandbox had, apply the index and the
// work tree diffs. $3 is the branch to check out ("-" for a detached HEAD)
// and $4 the commit. Tracked files it wrote in its last two seconds end up
// dated two seconds before it began, with the index refreshed.
const restoreScript = `set -e
cd "$1"; st="$2"
# Two seconds before anything here writes (see the end).
t=$(( $(date +%s) - 2 ))
for b in "$st"/bundle-*; do
  [ -e "$b" ] || continue
  git bundle unbundle "$b" >/dev/null
done
# No reflog for the refs the restore sets: they would only say "restored"
# (the captured sandbox's reflogs are not kept), and a sandbox copied by
# overlay would copy each up when its branch is renamed. Git starts one at
# the next commit.
while read -r sha ref; do git -c core.logAllRefUpdates=false update-ref "$ref" "$sha"; done < "$st/refs"
if [ "$3" = "-" ]; then git -c core.logAllRefUpdates=false checkout -q -f --detach "$4"; else git -c core.logAllRefUpdates=false checkout -q -f -B "$3" "$4"; fi
git clean -q -f -d
# A diff may hold no patch, only lines like "* Unmerged path x".
if grep -q '^diff --git ' "$st/index.diff" 2>/dev/null; then git apply --cached --binary "$st/index.diff"; fi
if grep -q '^diff --git ' "$st/worktree.diff" 2>/dev/null; then git apply --binary "$st/worktree.diff"; fi
# The checkout wrote files in the second it wrote the index: git takes such
# entries for "racily clean" and reads every one again at each status until
# the index is written in a later second (and a copy of this sandbox by
# overlay would copy each one up to do so). The tracked files written in the
# last two seconds are dated before the restore began and the index is
# refreshed (each of them read once, against the index): then no entry is
# racy, and one of them the diffs changed differs from its entry in mtime,
# whatever its size. Older files are left alone: not racy, not read again.
touch -d "@$(( $(date +%s) - 2 ))" "$st/recent"
git ls-files -z | xargs -0 -r printf './%s\0' | xargs -0 -r sh -c 'exec find "$@" -maxdepth 0 -newer "$0" -print0' "$st/recent" 2>/dev/null |
  xargs -0 -r touch -c -h -d "@$t" -- 2>/dev/null || true
git update-index -q --refresh >/dev/null 2>&1 || true
`

// symlinkScript lists the symbolic links in the work tree (outside .git).
const symlinkScript = `cd "$1" && find . -path ./.git -prune -o -type l -print0`

// untarScript unpacks a checked tarball (from $2) into $1, keeping modes.
const untarScript = `cd "$1" && tar -x -p --no-same-owner -f "$2"`

// intentToAddScript marks the files named on stdin (NUL-separated) intent
// to add (git add -N) in work tree $1.
const intentToAddScript = `cd "$1" && xargs -0 -r git add -N --`
