package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// The committed document is finished, and finishing is idempotent and
// leaves the rest in place.
func TestFinish(t *testing.T) {
	doc, err := os.ReadFile("../hangar.swagger.json")
	if err != nil {
		t.Fatal(err)
	}
	again, err := Finish(doc)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(doc) {
		t.Errorf("hangar.swagger.json is not finished (run api/generate.sh), or finishing is not idempotent")
	}
	var got struct {
		Swagger string `json:"swagger"`
		Info    struct{ Title, Version string }
		Paths   map[string]any
		Sec     map[string]struct{ Type, In, Name string } `json:"securityDefinitions"`
		Secure  []map[string][]string                      `json:"security"`
	}
	if err := json.Unmarshal(doc, &got); err != nil {
		t.Fatal(err)
	}
	if got.Swagger != "2.0" || got.Info.Title != Title || got.Info.Version != Version || len(got.Paths) < 20 ||
		got.Sec["bearer"].Name != "Authorization" || got.Sec["bearer"].In != "header" || len(got.Secure) != 1 {
		t.Errorf("document = %+v", got)
	}
	if !strings.HasPrefix(string(doc), "{\n  \"swagger\": \"2.0\",\n  \"info\": {") {
		t.Errorf("the document does not start as protoc-gen-openapiv2 writes it:\n%.200s", doc)
	}
}
