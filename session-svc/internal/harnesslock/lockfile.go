// Package harnesslock reads harness locks: named, revisioned records
// ("team-default@r14") of a harness, its concrete model, its approval mode
// and the CLI version it runs, kept in harnesses.lock.yaml in a git
// repository (HANGAR_HARNESS_REPO). A lock's earlier revisions are read
// from the file's git history. It also compares what a turn ran with its
// lock (drift.go).
package harnesslock

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// FileName is the lock file at the top of the harness repository.
const FileName = "harnesses.lock.yaml"

// Lock is one revision of a harness lock.
type Lock struct {
	Name     string
	Revision int
	// Harness is claude, codex, pi or antigravity.
	Harness string
	// Model is the concrete model the harness runs.
	Model string
	// Approvals is never or ask.
	Approvals string
	// CLIVersion is the agent CLI's version ("2.1.332").
	CLIVersion string
	// Environment is the environment a pin set on this lock (a fork at a
	// step's pin_set) runs in; optional ("": the lock is no pin set). A
	// thaw takes its environment from the caller.
	Environment string
	// Commit is the harness repository's commit the record was read at.
	Commit string
}

// Ref names the lock's revision: "team-default@r14".
func (l Lock) Ref() string { return l.Name + "@r" + strconv.Itoa(l.Revision) }

// The values a lock's fields take.
var (
	harnesses = []string{"claude", "codex", "pi", "antigravity"}
	approvals = []string{"never", "ask"}
	lockName  = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)
	// cliVersion is a release version: 2.1.332, 0.171.0, 1.6.0-beta.1.
	cliVersion = regexp.MustCompile(`^[0-9]+(\.[0-9]+)*([-+][0-9A-Za-z.-]+)?$`)
	lockRef    = regexp.MustCompile(`^([^@\s]+)(?:@r([0-9]+))?$`)
	// envName is an environment's name (a DNS label, as sandbox-svc has it).
	envName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// ParseError is a lock file that does not parse, or holds a record that is
// not a lock; Line is 1-based, 0 when unknown.
type ParseError struct {
	Line int
	Msg  string
}

func (e *ParseError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	}
	return e.Msg
}

func parseErr(n *yaml.Node, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &ParseError{Line: line, Msg: fmt.Sprintf(format, args...)}
}

// Parse reads a lock file: a mapping "locks" of lock name to its record.
//
//	locks:
//	  team-default:
//	    revision: 14
//	    harness: claude
//	    model: claude-sonnet-4-5-20250929
//	    approvals: never
//	    cli_version: 2.1.332
//	    environment: python               # optional: for pin sets
//
// Every field but environment is required; unknown keys are refused (a
// typo must not leave a field unpinned). The locks come back sorted by name.
func Parse(data []byte) ([]Lock, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &ParseError{Msg: "the file is empty: want a mapping with \"locks\""}
		}
		return nil, &ParseError{Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, parseErr(root, "want a mapping with \"locks\" at the top")
	}
	var locksNode *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "locks":
			locksNode = v
		default:
			return nil, parseErr(k, "unknown key %q at the top: want \"locks\"", k.Value)
		}
	}
	if locksNode == nil {
		return nil, parseErr(root, "no \"locks\" mapping")
	}
	if locksNode.Kind != yaml.MappingNode {
		return nil, parseErr(locksNode, "\"locks\" must map lock names to their records")
	}
	var out []Lock
	seen := map[string]bool{}
	for i := 0; i+1 < len(locksNode.Content); i += 2 {
		k, v := locksNode.Content[i], locksNode.Content[i+1]
		if !lockName.MatchString(k.Value) {
			return nil, parseErr(k, "lock name %q: want lowercase letters, digits, '.', '_' and '-' (at most 63)", k.Value)
		}
		if seen[k.Value] {
			return nil, parseErr(k, "lock %q is defined twice", k.Value)
		}
		seen[k.Value] = true
		l, err := parseRecord(k.Value, v)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func parseRecord(name string, n *yaml.Node) (Lock, error) {
	l := Lock{Name: name}
	if n.Kind != yaml.MappingNode {
		return l, parseErr(n, "lock %q: want a mapping of revision, harness, model, approvals, cli_version", name)
	}
	got := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if v.Kind != yaml.ScalarNode {
			return l, parseErr(v, "lock %q: %s must be a single value", name, k.Value)
		}
		if got[k.Value] {
			return l, parseErr(k, "lock %q: %s is given twice", name, k.Value)
		}
		got[k.Value] = true
		val := strings.TrimSpace(v.Value)
		switch k.Value {
		case "revision":
			r, err := strconv.Atoi(val)
			if err != nil || r < 1 {
				return l, parseErr(v, "lock %q: revision %q: want a whole number from 1", name, v.Value)
			}
			l.Revision = r
		case "harness":
			if !oneOf(val, harnesses) {
				return l, parseErr(v, "lock %q: harness %q is not one of %s", name, v.Value, strings.Join(harnesses, ", "))
			}
			l.Harness = val
		case "model":
			if val == "" || strings.ContainsAny(val, " \t\r\n") {
				return l, parseErr(v, "lock %q: model %q: want a model name without spaces", name, v.Value)
			}
			l.Model = val
		case "approvals":
			if !oneOf(val, approvals) {
				return l, parseErr(v, "lock %q: approvals %q is not one of %s", name, v.Value, strings.Join(approvals, ", "))
			}
			l.Approvals = val
		case "cli_version":
			if !cliVersion.MatchString(val) {
				return l, parseErr(v, "lock %q: cli_version %q: want the CLI's release version, e.g. 2.1.332", name, v.Value)
			}
			l.CLIVersion = val
		case "environment":
			if !envName.MatchString(val) {
				return l, parseErr(v, "lock %q: environment %q: want an environment's name (lowercase letters, digits and '-', at most 63)", name, v.Value)
			}
			l.Environment = val
		default:
			return l, parseErr(k, "lock %q: unknown field %q (want revision, harness, model, approvals, cli_version, and optionally environment)", name, k.Value)
		}
	}
	for _, f := range []string{"revision", "harness", "model", "approvals", "cli_version"} {
		if !got[f] {
			return l, parseErr(n, "lock %q: %s is missing (a lock pins every field)", name, f)
		}
	}
	return l, nil
}

func oneOf(v string, set []string) bool {
	for _, s := range set {
		if v == s {
			return true
		}
	}
	return false
}

// ParseRef splits "team-default@r14" into its name and revision; a bare
// name ("team-default") has revision 0: the newest.
func ParseRef(ref string) (name string, revision int, err error) {
	m := lockRef.FindStringSubmatch(strings.TrimSpace(ref))
	if m == nil || !lockName.MatchString(m[1]) {
		return "", 0, fmt.Errorf("harness lock %q: want NAME@rREVISION, e.g. team-default@r14 (or NAME for its newest revision)", ref)
	}
	if m[2] != "" {
		revision, err = strconv.Atoi(m[2])
		if err != nil || revision < 1 {
			return "", 0, fmt.Errorf("harness lock %q: the revision must be r1 or more", ref)
		}
	}
	return m[1], revision, nil
}

// versionIn is the first release version in a CLI's --version line or a
// user agent: "2.1.332 (Claude Code)" and "codex-cli 0.171.0" give
// 2.1.332 and 0.171.0.
var versionIn = regexp.MustCompile(`[0-9]+\.[0-9]+(\.[0-9]+)*([-+][0-9A-Za-z.-]+)?`)

// VersionOf is the release version in a CLI's --version output; "" when it
// names none.
func VersionOf(line string) string { return versionIn.FindString(line) }
