package scripted

import (
	"encoding/json"
)

// Wire protocols.
const (
	protoMessages  = "messages"
	protoResponses = "responses"
	protoChat      = "chat"
)

// anthropicRequest is the part of a Messages request the rules need.
type anthropicRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

type anthropicBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Content json.RawMessage `json:"content"`
}

// contentText returns the text of a string or an array of blocks, and
// whether it held a tool_result (with that result's text).
func anthropicContent(raw json.RawMessage) (text []string, toolResult bool, resultText string) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, false, ""
	}
	var blocks []anthropicBlock
	if json.Unmarshal(raw, &blocks) != nil {
		return nil, false, ""
	}
	for _, b := range blocks {
		switch b.Type {
		case "text":
			text = append(text, b.Text)
		case "tool_result":
			toolResult = true
			t, _, _ := anthropicContent(b.Content)
			resultText = joinText(t)
		}
	}
	return text, toolResult, resultText
}

func extractAnthropic(body []byte) (Request, bool, error) {
	var ar anthropicRequest
	if err := json.Unmarshal(body, &ar); err != nil {
		return Request{}, false, err
	}
	req := Request{Model: ar.Model, Size: len(body)}
	for _, t := range ar.Tools {
		req.Tools = append(req.Tools, t.Name)
	}
	for i := len(ar.Messages) - 1; i >= 0; i-- {
		m := ar.Messages[i]
		if m.Role != "user" {
			continue
		}
		text, isResult, resultText := anthropicContent(m.Content)
		if i == len(ar.Messages)-1 && isResult {
			req.LastIsToolResult = true
			req.ToolResult = resultText
		}
		if !isResult && req.Prompt == "" {
			req.Prompt = joinText(text)
			break
		}
	}
	return req, ar.Stream, nil
}

type responsesRequest struct {
	Model  string          `json:"model"`
	Stream bool            `json:"stream"`
	Input  json.RawMessage `json:"input"`
	Tools  []struct {
		Type     string `json:"type"`
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

type responsesItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Output  json.RawMessage `json:"output"`
}

func openaiContentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	var out []string
	for _, p := range parts {
		if p.Text != "" {
			out = append(out, p.Text)
		}
	}
	return joinText(out)
}

func extractResponses(body []byte) (Request, bool, error) {
	var rr responsesRequest
	if err := json.Unmarshal(body, &rr); err != nil {
		return Request{}, false, err
	}
	req := Request{Model: rr.Model, Size: len(body)}
	for _, t := range rr.Tools {
		name := t.Name
		if name == "" {
			name = t.Function.Name
		}
		if name == "" {
			name = t.Type
		}
		req.Tools = append(req.Tools, name)
	}
	var s string
	if json.Unmarshal(rr.Input, &s) == nil {
		req.Prompt = s
		return req, rr.Stream, nil
	}
	var items []responsesItem
	if err := json.Unmarshal(rr.Input, &items); err != nil {
		return Request{}, false, err
	}
	for i := len(items) - 1; i >= 0; i-- {
		it := items[i]
		switch {
		case it.Type == "function_call_output" || it.Type == "custom_tool_call_output" || it.Type == "local_shell_call_output":
			if i == len(items)-1 {
				req.LastIsToolResult = true
				req.ToolResult = openaiContentText(it.Output)
			}
		case (it.Type == "message" || it.Type == "") && it.Role == "user":
			if req.Prompt == "" {
				req.Prompt = openaiContentText(it.Content)
			}
		}
		if req.Prompt != "" {
			break
		}
	}
	return req, rr.Stream, nil
}

type chatRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

func extractChat(body []byte) (Request, bool, error) {
	var cr chatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		return Request{}, false, err
	}
	req := Request{Model: cr.Model, Size: len(body)}
	for _, t := range cr.Tools {
		req.Tools = append(req.Tools, t.Function.Name)
	}
	for i := len(cr.Messages) - 1; i >= 0; i-- {
		m := cr.Messages[i]
		if m.Role == "tool" && i == len(cr.Messages)-1 {
			req.LastIsToolResult = true
			req.ToolResult = openaiContentText(m.Content)
		}
		if m.Role == "user" {
			req.Prompt = openaiContentText(m.Content)
			break
		}
	}
	return req, cr.Stream, nil
}
