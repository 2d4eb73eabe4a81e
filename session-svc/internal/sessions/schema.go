package sessions

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hangar-dev/hangar/platform/fault"
)

// validOutputSchema checks --schema: a JSON object (a JSON Schema), or
// nothing.
func validOutputSchema(schema string) error {
	if schema == "" {
		return nil
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(schema), &v); err != nil {
		return fault.InvalidArgument("output_schema_json", "the output schema is not a JSON object")
	}
	return nil
}

// withOutputSchema tells the agent how to end its answer under --schema.
func withOutputSchema(message, schema string) string {
	if schema == "" {
		return message
	}
	var compact bytes.Buffer
	if json.Compact(&compact, []byte(schema)) != nil {
		compact.WriteString(schema)
	}
	return message + "\n\nWhen you have finished, end your final answer with one JSON object that matches this JSON Schema, and nothing after it:\n" + compact.String()
}

// maxStructuredScan bounds how much of an answer is searched for the JSON
// object (the end of the answer is kept).
const maxStructuredScan = 64 << 10

// structuredResult finds the last JSON object in an answer and checks it
// against the schema minimally: a JSON object holding every top-level key
// the schema's "required" lists. It returns the object as compact JSON, or
// a warning for the turn.
func structuredResult(text, schema string) (result, warning string) {
	if len(text) > maxStructuredScan {
		text = text[len(text)-maxStructuredScan:]
	}
	obj, ok := lastJSONObject(text)
	if !ok {
		return "", "no structured result: the final answer has no JSON object for the output schema"
	}
	var s struct {
		Required []any `json:"required"`
	}
	_ = json.Unmarshal([]byte(schema), &s)
	var missing []string
	for _, r := range s.Required {
		if k, ok := r.(string); ok {
			if _, found := obj[k]; !found {
				missing = append(missing, k)
			}
		}
	}
	if len(missing) > 0 {
		return "", fmt.Sprintf("no structured result: the final answer's JSON object lacks the required %s", strings.Join(missing, ", "))
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return "", "no structured result: the final answer's JSON object could not be kept"
	}
	return string(b), ""
}

// lastJSONObject returns the last complete top-level JSON object in text
// (in a code fence or not): objects are read left to right, each from the
// first '{' that starts a valid one after the previous.
func lastJSONObject(text string) (map[string]any, bool) {
	var last map[string]any
	found := false
	for i := 0; i < len(text); {
		j := strings.IndexByte(text[i:], '{')
		if j < 0 {
			break
		}
		i += j
		dec := json.NewDecoder(strings.NewReader(text[i:]))
		dec.UseNumber()
		var obj map[string]any
		if err := dec.Decode(&obj); err == nil && obj != nil {
			last, found = obj, true
			i += int(dec.InputOffset())
			continue
		}
		i++
	}
	return last, found
}
