// Command finish completes the merged OpenAPI document protoc-gen-openapiv2
// writes (api/generate.sh runs it): a title and version instead of the
// first file's name and "version not set", and the bearer token as its
// security scheme (Swagger 2.0 has no http bearer scheme: an apiKey in the
// Authorization header is how 2.0 says it). Every other part of the
// document stays byte for byte, in its order.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// Title and Version name the API: the contract's packages are all v1.
const (
	Title   = "hangar API"
	Version = "v1"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: finish FILE.swagger.json")
		os.Exit(2)
	}
	if err := finish(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "finish:", err)
		os.Exit(1)
	}
}

func finish(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := Finish(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644)
}

// Finish returns doc with info, securityDefinitions and security set.
func Finish(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object")
	}
	var keys []string
	values := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if _, dup := values[key]; !dup {
			keys = append(keys, key)
		}
		values[key] = v
	}
	info := map[string]any{}
	if v, ok := values["info"]; ok {
		if err := json.Unmarshal(v, &info); err != nil {
			return nil, err
		}
	}
	info["title"], info["version"] = Title, Version
	info["description"] = "The hangar control plane: sessions, sandboxes, checkpoints, the model gateway and replays. " +
		"Every call needs the API token as a bearer token (Authorization: Bearer TOKEN); /healthz and /readyz do not."
	set := func(key string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, ok := values[key]; !ok {
			keys = append(keys, key)
		}
		values[key] = b
		return nil
	}
	if err := set("info", info); err != nil {
		return nil, err
	}
	if err := set("securityDefinitions", map[string]any{
		"bearer": map[string]any{
			"type": "apiKey", "in": "header", "name": "Authorization",
			"description": "The API token, as `Bearer TOKEN` (hangar up prints it and keeps it in HANGAR_HOME/token).",
		},
	}); err != nil {
		return nil, err
	}
	if err := set("security", []any{map[string]any{"bearer": []any{}}}); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("{\n")
	for i, k := range keys {
		kb, _ := json.Marshal(k)
		var v bytes.Buffer
		if err := json.Indent(&v, compact(values[k]), "  ", "  "); err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "  %s: %s", kb, v.Bytes())
		if i < len(keys)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString("}\n")
	return b.Bytes(), nil
}

func compact(v []byte) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, v); err != nil {
		return v
	}
	return b.Bytes()
}
