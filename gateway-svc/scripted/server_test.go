package scripted_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

const yamlScript = `
rules:
  - name: after tool
    last_is_tool_result: true
    answer: {text: "All done."}
  - name: write
    tool: Write
    prompt: "(?i)create hello"
    answer:
      tool_call: {name: Write, input: {file_path: hello.txt, content: "hi\n"}}
  - name: exec
    tool: exec_command
    prompt: "(?i)create hello"
    answer:
      tool_call: {name: exec_command, input: {cmd: "echo hi > hello.txt"}}
  - name: bash
    tool: bash
    prompt: "(?i)create hello"
    answer:
      tool_call: {name: bash, input: {command: "echo hi > hello.txt"}}
default: {text: "Hello from the script."}
`

// sseEvents reads an SSE body into (event, data) pairs.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func sseEvents(t *testing.T, r io.Reader) [][2]string {
	t.Helper()
	var out [][2]string
	var ev string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			ev = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			out = append(out, [2]string{ev, strings.TrimPrefix(line, "data: ")})
			ev = ""
		}
	}
	return out
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestProtocols(t *testing.T) {
	t.Parallel()
	script, err := scripted.Parse([]byte(yamlScript))
	if err != nil {
		t.Fatal(err)
	}
	srv := scripted.MustNew(script)
	ts := httptest.NewServer(srv)
	defer ts.Close()

	tests := []struct {
		name, path, body string
		wantIn           []string
	}{
		{"messages tool call", "/v1/messages?beta=true",
			`{"model":"claude-x","stream":true,"system":"s","tools":[{"name":"Write"}],"messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"Please create hello.txt"}]}]}`,
			[]string{"event:message_start", `"type":"tool_use"`, `"name":"Write"`, `input_json_delta`, `"stop_reason":"tool_use"`, "event:message_stop"}},
		{"messages tool result", "/v1/messages",
			`{"model":"claude-x","stream":true,"tools":[{"name":"Write"}],"messages":[{"role":"user","content":"create hello"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Write","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]}`,
			[]string{"All done.", `"stop_reason":"end_turn"`}},
		{"responses tool call", "/v1/responses",
			`{"model":"gpt-5.5","stream":true,"tools":[{"type":"function","name":"exec_command"}],"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"create hello"}]}]}`,
			[]string{"event:response.output_item.done", `"type":"function_call"`, `exec_command`, "event:response.completed", `"total_tokens"`}},
		{"responses tool result", "/v1/responses",
			`{"model":"gpt-5.5","stream":true,"tools":[{"type":"function","name":"exec_command"}],"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"create hello"}]},{"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"done"}]}`,
			[]string{"All done.", "response.completed"}},
		{"chat tool call", "/v1/chat/completions",
			`{"model":"m","stream":true,"tools":[{"type":"function","function":{"name":"bash"}}],"messages":[{"role":"system","content":"s"},{"role":"user","content":"create hello"}]}`,
			[]string{`"tool_calls"`, `"finish_reason":"tool_calls"`, `"prompt_tokens"`, "[DONE]"}},
		{"chat default", "/v1/chat/completions",
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			[]string{"Hello from the script.", `"finish_reason":"stop"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, ts.URL+tc.path, tc.body)
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			var flat strings.Builder
			for _, e := range sseEvents(t, resp.Body) {
				if e[0] != "" {
					flat.WriteString("event:" + e[0] + "\n")
				}
				flat.WriteString(e[1] + "\n")
			}
			for _, w := range tc.wantIn {
				if !strings.Contains(flat.String(), w) {
					t.Errorf("answer lacks %q:\n%s", w, flat.String())
				}
			}
		})
	}
	if got := srv.Requests(); got != int64(len(tests)) {
		t.Errorf("Requests() = %d, want %d", got, len(tests))
	}
}

func TestNonStreamingAndErrors(t *testing.T) {
	t.Parallel()
	srv := scripted.MustNew(scripted.Script{Rules: []scripted.Rule{
		{Prompt: "fail", Answer: scripted.Answer{Error: &scripted.ErrorAnswer{Status: 529, Type: "overloaded_error", Message: "busy"}}},
		{Answer: scripted.Answer{Text: "plain", Usage: &scripted.Usage{InputTokens: 7, OutputTokens: 3}}},
	}})
	ts := httptest.NewServer(srv)
	defer ts.Close()

	resp := post(t, ts.URL+"/v1/messages", `{"model":"x","messages":[{"role":"user","content":"hi"}]}`)
	var msg struct {
		Type    string
		Content []struct{ Type, Text string }
		Usage   struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil {
		t.Fatal(err)
	}
	if msg.Type != "message" || msg.Content[0].Text != "plain" || msg.Usage.InputTokens != 7 || msg.Usage.OutputTokens != 3 {
		t.Errorf("got %+v", msg)
	}

	resp = post(t, ts.URL+"/v1/messages", `{"model":"x","messages":[{"role":"user","content":"fail"}]}`)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 529 || !strings.Contains(string(b), `"overloaded_error"`) {
		t.Errorf("error answer: %d %s", resp.StatusCode, b)
	}
	resp = post(t, ts.URL+"/v1/responses", `{not json`)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), `"error"`) {
		t.Errorf("malformed: %d %s", resp.StatusCode, b)
	}
	req, _ := http.NewRequest(http.MethodHead, ts.URL+"/", nil)
	hr, err := http.DefaultClient.Do(req)
	if err != nil || hr.StatusCode != 200 {
		t.Errorf("HEAD /: %v %v", hr, err)
	}
}

func TestResetMidStream(t *testing.T) {
	t.Parallel()
	srv := scripted.MustNew(scripted.Script{Default: &scripted.Answer{Text: "abcdef", Chunks: 3, ResetAfterEvents: 2}})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	resp := post(t, ts.URL+"/v1/messages", `{"model":"x","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	_, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatal("want an error reading a reset stream")
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	if _, err := scripted.Parse([]byte("rules: [{prompt: '('}]")); err == nil {
		t.Error("bad regexp accepted")
	}
	if _, err := scripted.Parse([]byte("rules: {")); err == nil {
		t.Error("bad yaml accepted")
	}
	if _, err := scripted.Load("/nonexistent/script.yaml"); err == nil {
		t.Error("missing file accepted")
	}
}

func TestDemoScript(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(scripted.MustNew(scripted.Demo()))
	defer srv.Close()
	body := `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":100,"tools":[{"name":"Bash","input_schema":{}}],` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"<system-reminder>ignore</system-reminder>"},{"type":"text","text":"it's a plan"}]}]}`
	resp := post(t, srv.URL+"/v1/messages", body)
	evs := sseEvents(t, resp.Body)
	resp.Body.Close()
	var input string
	for _, ev := range evs {
		if strings.Contains(ev[1], "input_json_delta") {
			var d struct {
				Delta struct {
					PartialJSON string `json:"partial_json"`
				} `json:"delta"`
			}
			_ = json.Unmarshal([]byte(ev[1]), &d)
			input = d.Delta.PartialJSON
		}
	}
	var in struct {
		Command string `json:"command"`
	}
	if err := json.Unmarshal([]byte(input), &in); err != nil {
		t.Fatalf("tool input %q: %v", input, err)
	}
	dir := t.TempDir()
	cmd := exec.Command("bash", "-c", in.Command)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", in.Command, err, out)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "NOTES.md"))
	if string(got) != "it's a plan\n" {
		t.Errorf("NOTES.md = %q", got)
	}
	resp = post(t, srv.URL+"/v1/messages", `{"model":"m","stream":true,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":"wrote NOTES.md"}]}]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "NOTES.md") || !strings.Contains(string(b), "end_turn") {
		t.Errorf("summary answer:\n%s", b)
	}
}
