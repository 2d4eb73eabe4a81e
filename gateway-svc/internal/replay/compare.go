// Package replay compares a replayed run's model request with the taped one
// and classifies the first difference: model (outside tool outputs), tool (a
// tool output differs) or network (a differing tool output shows a network
// error), or tree (the work tree a step left differs).
package replay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
)

// volatileKeys are top-level request fields that differ between two runs of
// the same conversation without meaning anything: session-scoped ids and
// client metadata.
var volatileKeys = map[string]bool{
	"metadata":          true, // Anthropic: user_id carries the CLI's session id
	"prompt_cache_key":  true, // Responses: the conversation id
	"client_metadata":   true,
	"safety_identifier": true,
	"user":              true,
}

// volatileOutput matches the parts of tool outputs that change on every
// execution of the same command (Codex's exec_command wall time and chunk
// id). One expression per literal start: an expression that starts with a
// literal skips to it (strings.Index); an alternation of literals runs the
// NFA over every byte (removeVolatile).
var volatileOutput = []*regexp.Regexp{
	regexp.MustCompile(`Wall time: [0-9.]+ seconds`),
	regexp.MustCompile(`Chunk ID: [0-9a-zA-Z]+`),
	regexp.MustCompile(`took [0-9.]+m?s`),
}

// removeVolatile is s without the parts volatileOutput matches.
func removeVolatile(s string) string {
	for _, re := range volatileOutput {
		s = re.ReplaceAllLiteralString(s, "")
	}
	return s
}

// networkError matches tool output that shows a failed network access.
var networkError = regexp.MustCompile(`(?i)(could not resolve host|connection refused|network is unreachable|name or service not known|temporary failure in name resolution|no route to host|connection timed out|failed to connect to|getaddrinfo|ENOTFOUND|ECONNREFUSED|ENETUNREACH|EAI_AGAIN|ETIMEDOUT)`)

// IsNetworkError reports whether a tool output shows a network error.
func IsNetworkError(s string) bool { return networkError.MatchString(s) }

const maxShown = 2000

// dateLines match the date the CLIs put in their context (Claude Code's
// "Today's date is 2026-12-01", Codex's <current_date>): it differs between
// two executions on different days. Each is replaced by its literal start
// and "<date>". One expression per literal start, as for volatileOutput:
// the single alternation this was took 6-8 ms per 80 kB Claude Code
// request (two per replayed step), the NFA stepping every byte; each of
// these skips to its literal.
var dateLines = []struct {
	re   *regexp.Regexp
	repl []byte
}{
	{regexp.MustCompile(`Today's date is [0-9]{4}-[0-9]{2}-[0-9]{2}`), []byte("Today's date is <date>")},
	{regexp.MustCompile(`Today's date: [0-9]{4}-[0-9]{2}-[0-9]{2}`), []byte("Today's date: <date>")},
	{regexp.MustCompile(`<current_date>[0-9]{4}-[0-9]{2}-[0-9]{2}`), []byte("<current_date><date>")},
	{regexp.MustCompile(`Current date: [0-9]{4}-[0-9]{2}-[0-9]{2}`), []byte("Current date: <date>")},
}

// Canon is what a replay legitimately has different from its tape besides
// ids and dates: the work tree path, which holds the session's name.
type Canon struct {
	// TapeSession is the session the taped run belonged to; Session the
	// replaying run's. Their work tree and home paths (.../<session>/work,
	// .../<session>/home) and Claude Code's project directory names
	// (-...-<session>-work) compare equal.
	TapeSession, Session string
}

// apply rewrites b's volatile text to a fixed form: the date line, the
// session's work tree path and a session branch.
func (c Canon) apply(b []byte, session string) []byte {
	// Each rewrite runs only where its literal occurs: a rewrite copies
	// the whole body even when it changes nothing.
	for _, d := range dateLines {
		b = replaceRe(b, d.re, d.repl)
	}
	if session != "" {
		b = replaceText(b, "/"+session+"/work", "/<session>/work")
		b = replaceText(b, "/"+session+"/home", "/<session>/home")
		b = replaceText(b, "-"+session+"-work", "-<session>-work")
	}
	// The session's branch, which a CLI's git context names. It is not
	// always named after the session (a job's attempt is on
	// hangar/session/<job session>-fork-<n>), but a replay always runs in
	// a session of its own: any hangar session branch stands for the
	// session's own.
	return replaceRe(b, sessionBranch, []byte("hangar/session/<session>"))
}

// replaceRe replaces re's matches in b with repl (literally), when b holds
// re's literal start at all.
func replaceRe(b []byte, re *regexp.Regexp, repl []byte) []byte {
	if lit, _ := re.LiteralPrefix(); !bytes.Contains(b, []byte(lit)) {
		return b
	}
	return re.ReplaceAllLiteral(b, repl)
}

// replaceText replaces old with new in b, when b holds it.
func replaceText(b []byte, old, new string) []byte {
	if !bytes.Contains(b, []byte(old)) {
		return b
	}
	return bytes.ReplaceAll(b, []byte(old), []byte(new))
}

// sessionBranch matches a hangar session branch (hangar/session/<name>).
var sessionBranch = regexp.MustCompile(`hangar/session/[A-Za-z0-9._-]+`)

// Compare returns nil when the incoming request matches the taped one, or
// the first divergence (Seq unset).
func Compare(provider gatewayv1.Provider, taped, incoming []byte) *gatewayv1.Divergence {
	return CompareCanon(provider, Canon{}, taped, incoming)
}

// CompareCanon is Compare with the work tree paths of canon's two sessions
// taken as equal.
func CompareCanon(provider gatewayv1.Provider, canon Canon, taped, incoming []byte) *gatewayv1.Divergence {
	if bytes.Equal(taped, incoming) {
		return nil
	}
	taped = canon.apply(taped, canon.TapeSession)
	incoming = canon.apply(incoming, canon.Session)
	if sameOutsideVolatile(taped, incoming) {
		return nil
	}
	var a, b any
	errA := decode(taped, &a)
	errB := decode(incoming, &b)
	if errA != nil || errB != nil {
		return &gatewayv1.Divergence{Kind: gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL, Detail: "request body is not the taped one",
			Expected: clip(string(taped)), Actual: clip(string(incoming))}
	}
	if ma, ok := a.(map[string]any); ok {
		for k := range volatileKeys {
			delete(ma, k)
		}
	}
	if mb, ok := b.(map[string]any); ok {
		for k := range volatileKeys {
			delete(mb, k)
		}
	}
	dropItemIDs(a)
	dropItemIDs(b)
	dropMCPTools(a)
	dropMCPTools(b)
	answerFromTape(provider, a, b)
	var diffs []difference
	walk(nil, a, b, &diffs)
	if len(diffs) == 0 {
		return nil
	}
	// The first difference outside tool outputs makes it a model divergence;
	// otherwise it is a tool (or network) divergence.
	var toolDiff *difference
	for i := range diffs {
		d := &diffs[i]
		if !inToolOutput(provider, a, b, d.path) {
			return d.divergence(gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL, "request differs at "+d.where())
		}
		if toolDiff == nil {
			toolDiff = d
		}
	}
	if IsNetworkError(toolDiff.actual) {
		return toolDiff.divergence(gatewayv1.DivergenceKind_DIVERGENCE_KIND_NETWORK, "tool output differs with a network error at "+toolDiff.where())
	}
	return toolDiff.divergence(gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL, "tool output differs at "+toolDiff.where())
}

// sameOutsideVolatile reports whether two canonicalised request bodies are
// JSON objects whose fields, the volatile ones (volatileKeys) left out,
// are byte for byte the same: then the full comparison below would find
// no difference (it decodes equal bytes to equal values, and its other
// rules, applied to equal values, leave them equal), so it is skipped. A
// replayed Claude Code request differs from its tape only in its session
// id (metadata) once canonicalised; decoding its 80 kB twice into maps
// and walking them took 2-3 ms of every replayed step. Anything else (a
// field that differs, other spacing) goes the full way.
func sameOutsideVolatile(a, b []byte) bool {
	ma, okA := fields(a)
	mb, okB := fields(b)
	if !okA || !okB || len(ma) != len(mb) {
		return false
	}
	for k, va := range ma {
		vb, ok := mb[k]
		if !ok || !bytes.Equal(va, vb) {
			return false
		}
	}
	return true
}

// fields are the fields of the JSON object b but the volatile ones, as
// their raw bytes; false when b is not one object. (A decoder scans b
// once; json.Unmarshal would scan it twice, validating it first.)
func fields(b []byte) (map[string]json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		if !volatileKeys[k] {
			out[k] = v
		}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return out, true
}

// dropItemIDs removes the ids a Responses client gives its own input items
// (Codex: "msg_<uuid>" per session); the items' content is compared.
func dropItemIDs(v any) {
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	items, ok := m["input"].([]any)
	if !ok {
		return
	}
	for _, it := range items {
		if im, ok := it.(map[string]any); ok {
			role, _ := im["role"].(string)
			typ, _ := im["type"].(string)
			if role != "" && role != "assistant" || strings.HasSuffix(typ, "_output") {
				delete(im, "id")
			}
		}
	}
}

// dropMCPTools removes the definitions of MCP tools ("mcp__<server>__<tool>"
// in Claude Code and Codex) from the tools a request offers: a replay's
// sandbox reaches no MCP server (egress none, no credentials), so its CLI
// offers none of their tools, and its calls of them are answered from the
// tape (answerFromTape). Every other tool definition is compared.
func dropMCPTools(v any) {
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	tools, ok := m["tools"].([]any)
	if !ok {
		return
	}
	kept := tools[:0:0]
	for _, tl := range tools {
		t := asMap(tl)
		name := str(t, "name")
		if name == "" {
			name = str(asMap(t["function"]), "name") // Chat Completions
		}
		if !strings.HasPrefix(name, "mcp__") {
			kept = append(kept, tl)
		}
	}
	m["tools"] = kept
}

func decode(b []byte, v *any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(v)
}

func clip(s string) string {
	if len(s) > maxShown {
		return s[:maxShown] + "…"
	}
	return s
}

type difference struct {
	path             []any // string keys and int indexes
	expected, actual string
}

func (d *difference) where() string {
	var sb strings.Builder
	for _, p := range d.path {
		switch v := p.(type) {
		case string:
			sb.WriteString("." + v)
		case int:
			sb.WriteString("[" + strconv.Itoa(v) + "]")
		}
	}
	return strings.TrimPrefix(sb.String(), ".")
}

func (d *difference) divergence(kind gatewayv1.DivergenceKind, detail string) *gatewayv1.Divergence {
	exp, act := window(d.expected, d.actual)
	return &gatewayv1.Divergence{Kind: kind, Detail: detail, Expected: exp, Actual: act}
}

// window cuts two long strings to the part around their first difference.
func window(a, b string) (string, string) {
	if len(a) <= maxShown && len(b) <= maxShown {
		return a, b
	}
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(0, i-200)
	cut := func(s string) string {
		if from >= len(s) {
			return ""
		}
		end := min(len(s), from+maxShown)
		out := s[from:end]
		if from > 0 {
			out = "…" + out
		}
		if end < len(s) {
			out += "…"
		}
		return out
	}
	return cut(a), cut(b)
}

func show(v any) string {
	if v == nil {
		return "<absent>"
	}
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func walk(path []any, a, b any, out *[]difference) {
	if len(*out) > 64 {
		return
	}
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			walk(append(path[:len(path):len(path)], k), av[k], bv[k], out)
		}
		return
	case []any:
		bv, ok := b.([]any)
		if !ok {
			break
		}
		for i := 0; i < max(len(av), len(bv)); i++ {
			var x, y any
			if i < len(av) {
				x = av[i]
			}
			if i < len(bv) {
				y = bv[i]
			}
			walk(append(path[:len(path):len(path)], i), x, y, out)
		}
		return
	case string:
		if bs, ok := b.(string); ok {
			if av == bs || removeVolatile(av) == removeVolatile(bs) && len(path) > 2 {
				return
			}
		}
	default:
		if fmt.Sprint(a) == fmt.Sprint(b) && sameKind(a, b) {
			return
		}
	}
	*out = append(*out, difference{path: path, expected: show(a), actual: show(b)})
}

func sameKind(a, b any) bool {
	return fmt.Sprintf("%T", a) == fmt.Sprintf("%T", b)
}

// inToolOutput reports whether path lies inside a tool output of the
// request in either version.
func inToolOutput(provider gatewayv1.Provider, a, b any, path []any) bool {
	return toolOutputPath(provider, a, path) || toolOutputPath(provider, b, path)
}

func toolOutputPath(provider gatewayv1.Provider, root any, path []any) bool {
	get := func(n int) any {
		cur := root
		for _, p := range path[:n] {
			switch k := p.(type) {
			case string:
				m, ok := cur.(map[string]any)
				if !ok {
					return nil
				}
				cur = m[k]
			case int:
				s, ok := cur.([]any)
				if !ok || k >= len(s) {
					return nil
				}
				cur = s[k]
			}
		}
		return cur
	}
	typeOf := func(v any, field string) string {
		m, _ := v.(map[string]any)
		s, _ := m[field].(string)
		return s
	}
	switch provider {
	case gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES:
		// messages[i].content[j] is a tool_result block: everything below.
		if len(path) >= 4 && path[0] == "messages" && path[2] == "content" {
			blk := get(4)
			// The whole block but the id it answers: content, is_error.
			return typeOf(blk, "type") == "tool_result" && (len(path) == 4 || path[4] != "tool_use_id" && path[4] != "type")
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
		if len(path) >= 2 && path[0] == "input" {
			t := typeOf(get(2), "type")
			if t == "function_call_output" || t == "custom_tool_call_output" || t == "local_shell_call_output" {
				return len(path) == 2 || path[2] == "output"
			}
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS:
		if len(path) >= 2 && path[0] == "messages" {
			if typeOf(get(2), "role") == "tool" {
				return len(path) == 2 || path[2] == "content"
			}
		}
	}
	return false
}

// CompareTree compares the work tree hash taped for a step (taken when the
// run's request arrived) with the replay's: nil when they match or either
// is unknown (a run recorded without a sandbox to hash, a hash that could
// not be taken), else a tree divergence (Seq unset). A tree hash is a git
// tree of the work tree's content as `git add -A` sees it, so nothing in it
// is canonicalised: the work tree's path is not part of it.
func CompareTree(taped, replayed string) *gatewayv1.Divergence {
	if taped == "" || replayed == "" || taped == replayed {
		return nil
	}
	return &gatewayv1.Divergence{Kind: gatewayv1.DivergenceKind_DIVERGENCE_KIND_TREE,
		Detail:   "the work tree the tools left before this request is not the one the run recorded",
		Expected: taped, Actual: replayed}
}
