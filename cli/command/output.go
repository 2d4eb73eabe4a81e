package command

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/hangar-dev/hangar/platform/apijson"
)

// outputFormat is -o on every command that reads: table (for people, the
// default), json (the same JSON the REST API answers, apijson: proto field
// names, every field, enums as the docs write them, 64-bit integers as
// numbers) or yaml (that JSON as YAML).
type outputFormat struct {
	value string
}

// addOutputFlag registers -o/--output on cmd.
func addOutputFlag(cmd *cobra.Command) *outputFormat {
	o := &outputFormat{value: "table"}
	cmd.Flags().StringVarP(&o.value, "output", "o", "table", "table, json (the REST API's JSON) or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	return o
}

// check refuses a format not known; "text" is an old name of table.
func (o *outputFormat) check() error {
	switch strings.ToLower(o.value) {
	case "table", "text", "":
		o.value = "table"
	case "json", "yaml":
		o.value = strings.ToLower(o.value)
	default:
		return fmt.Errorf("-o %q: want table, json or yaml", o.value)
	}
	return nil
}

func (o *outputFormat) table() bool { return o.value == "table" }

// write prints m as json or yaml, or calls table.
func (o *outputFormat) write(w io.Writer, m proto.Message, table func() error) error {
	if o.table() {
		return table()
	}
	return writeMessage(w, o.value, m)
}

// writeMessage prints m as the REST API's JSON (indented), or as YAML.
func writeMessage(w io.Writer, format string, m proto.Message) error {
	b, err := apijson.MarshalIndent(m)
	if err != nil {
		return err
	}
	if format == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
