// Package config fills a typed configuration struct from command-line flags
// and HANGAR_* environment variables, and validates it once, at start.
//
// A configuration is a struct whose fields carry tags:
//
//	type Config struct {
//		config.Common
//		IdleMinutes int `env:"HANGAR_SESSION_IDLE_MINUTES" flag:"session-idle-minutes" default:"30" min:"0" unit:"minutes" help:"minutes before an idle session is stopped"`
//	}
//
// Tags:
//
//   - env:"HANGAR_X"   environment variable read for the field
//   - flag:"x"         command-line flag registered for the field
//   - default:"..."    value used when neither the flag nor the variable is set
//   - help:"..."       text shown by -h
//   - min, max         inclusive bounds for int, int64, float64 and time.Duration fields
//   - unit:"minutes"   word used in error messages for numbers ("want a whole number of minutes")
//   - oneof:"a|b|c"    allowed values for string and []string fields
//   - required:"true"  the resolved value must not be empty
//   - path:"true"      a leading "~/" is replaced by the user's home directory
//
// Supported field types are string, bool, int, int64, float64, time.Duration
// and []string (comma separated; blanks around items are trimmed and empty
// items dropped). Struct fields, embedded or not, are walked; fields with
// neither an env nor a flag tag are left alone.
//
// Precedence is: a flag given on the command line, then a non-empty
// environment variable, then the default. An environment variable set to the
// empty string counts as unset (so HANGAR_HOME= falls back to the default);
// pass the flag with an empty value to force an empty string.
//
// Errors are one line that names the variable (or flag) and says what to fix:
//
//	HANGAR_SESSION_IDLE_MINUTES="abc": want a whole number of minutes (>= 0)
//	HANGAR_LOG_LEVEL="loud": want one of debug|info|warn|error
//	HANGAR_TOKEN is required
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Common holds the settings every hangar service shares. Embed it in a
// service's configuration struct.
type Common struct {
	// Home is the data directory.
	Home string `env:"HANGAR_HOME" flag:"home" default:"~/.hangar" path:"true" help:"data directory"`
	// Token is the API bearer token. Services check that it is non-empty
	// themselves (some commands do not need it). Prefer the environment
	// variable: flags are visible to other users in the process list.
	Token string `env:"HANGAR_TOKEN" flag:"token" help:"API bearer token (prefer the environment variable)"`
	// LogLevel is one of debug, info, warn, error.
	LogLevel string `env:"HANGAR_LOG_LEVEL" flag:"log-level" default:"info" oneof:"debug|info|warn|error" help:"log level"`
	// LogFormat is text or json.
	LogFormat string `env:"HANGAR_LOG_FORMAT" flag:"log-format" default:"text" oneof:"text|json" help:"log format"`
	// OTLPEndpoint is the host:port of an OTLP/gRPC trace collector; empty
	// means traces are not exported.
	OTLPEndpoint string `env:"HANGAR_OTLP_ENDPOINT" flag:"otlp-endpoint" help:"host:port of an OTLP/gRPC trace collector; empty disables export"`
	// RedisURL is a redis://, rediss:// or unix:// URL; empty means an
	// embedded in-process Redis.
	RedisURL string `env:"HANGAR_REDIS_URL" flag:"redis-url" help:"redis://, rediss:// or unix:// URL; empty runs an embedded Redis"`
	// MaxRequestMB caps a REST request body and a gRPC message a service
	// receives (413 / ResourceExhausted beyond it). 64 MB takes a turn's
	// attachments and a session's git bundle; a REST body carries bytes
	// fields as base64, a third larger than over gRPC.
	MaxRequestMB int `env:"HANGAR_MAX_REQUEST_MB" flag:"max-request-mb" default:"64" min:"1" max:"2047" unit:"MB" help:"largest REST request body or gRPC message a service accepts"`
}

// MaxRequestBytes is MaxRequestMB in bytes (0 when unset: the default).
func (c Common) MaxRequestBytes() int64 { return int64(c.MaxRequestMB) << 20 }

// Load registers a flag for every tagged field of the struct dst points to on
// fs, parses args with fs, and then sets each field from its flag, its
// environment variable (looked up with lookupEnv) or its default, validating
// the result.
//
// fs may be nil (a private flag set is used); lookupEnv may be nil
// (os.LookupEnv is used). If args contain -h or -help, Load returns
// flag.ErrHelp after fs has printed the usage; an unknown flag returns the
// flag package's error unchanged.
func Load(dst any, fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) error {
	if fs == nil {
		fs = flag.NewFlagSet("hangar", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
	}
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	rv := reflect.ValueOf(dst)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("config: Load wants a non-nil pointer to a struct, got %T", dst)
	}

	var fields []*field
	if err := collect(rv.Elem(), "", &fields); err != nil {
		return err
	}
	for _, f := range fields {
		if f.flag == "" {
			continue
		}
		if fs.Lookup(f.flag) != nil {
			return fmt.Errorf("config: field %s: flag -%s is already defined", f.goName, f.flag)
		}
		fs.Var(f.value, f.flag, f.usage())
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, f := range fields {
		if err := f.resolve(lookupEnv); err != nil {
			return err
		}
	}
	return nil
}

var durationType = reflect.TypeFor[time.Duration]()

// field is one configurable struct field.
type field struct {
	goName   string // Go path for programmer errors, e.g. "Common.Home"
	target   reflect.Value
	env      string
	flag     string
	def      string
	hasDef   bool
	help     string
	unit     string
	oneof    []string
	min, max *float64 // bounds; durations are in nanoseconds
	required bool
	homePath bool // expand a leading "~/"
	value    *flagValue
}

func collect(v reflect.Value, prefix string, out *[]*field) error {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		fv := v.Field(i)
		name := prefix + sf.Name
		env, hasEnv := sf.Tag.Lookup("env")
		flg, hasFlag := sf.Tag.Lookup("flag")
		if !hasEnv && !hasFlag {
			if sf.Type.Kind() == reflect.Struct {
				if err := collect(fv, name+".", out); err != nil {
					return err
				}
				continue
			}
			for _, tag := range []string{"default", "min", "max", "oneof", "required", "path", "unit"} {
				if _, ok := sf.Tag.Lookup(tag); ok {
					return fmt.Errorf("config: field %s has a %s tag but neither an env nor a flag tag", name, tag)
				}
			}
			continue
		}
		f, err := newField(name, fv, sf.Tag, env, flg)
		if err != nil {
			return err
		}
		*out = append(*out, f)
	}
	return nil
}

func newField(name string, v reflect.Value, tag reflect.StructTag, env, flg string) (*field, error) {
	f := &field{goName: name, target: v, env: env, flag: flg}
	if !supported(v.Type()) {
		return nil, fmt.Errorf("config: field %s has unsupported type %s", name, v.Type())
	}
	f.def, f.hasDef = tag.Lookup("default")
	f.help = tag.Get("help")
	f.unit = tag.Get("unit")
	f.required = tag.Get("required") == "true"
	f.homePath = tag.Get("path") == "true"
	if s, ok := tag.Lookup("oneof"); ok {
		if k := v.Kind(); k != reflect.String && k != reflect.Slice {
			return nil, fmt.Errorf("config: field %s: oneof is only for string and []string fields", name)
		}
		f.oneof = strings.Split(s, "|")
	}
	for _, b := range []struct {
		tag string
		dst **float64
	}{{"min", &f.min}, {"max", &f.max}} {
		s, ok := tag.Lookup(b.tag)
		if !ok {
			continue
		}
		if !numeric(v.Type()) {
			return nil, fmt.Errorf("config: field %s: %s is only for numbers and durations", name, b.tag)
		}
		n, err := parseNumber(v.Type(), s)
		if err != nil {
			return nil, fmt.Errorf("config: field %s: bad %s tag %q: %w", name, b.tag, s, err)
		}
		*b.dst = &n
	}
	f.value = &flagValue{isBool: v.Kind() == reflect.Bool}
	if f.hasDef {
		f.value.raw = f.def
	}
	return f, nil
}

func supported(t reflect.Type) bool {
	if t == durationType {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Float64:
		return true
	case reflect.Slice:
		return t.Elem().Kind() == reflect.String
	}
	return false
}

func numeric(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Float64:
		return true
	}
	return false
}

// parseNumber parses s as a value of t and returns it as a float64 for bound
// checks (durations in nanoseconds).
func parseNumber(t reflect.Type, s string) (float64, error) {
	switch {
	case t == durationType:
		d, err := time.ParseDuration(s)
		return float64(d), err
	case t.Kind() == reflect.Float64:
		return strconv.ParseFloat(s, 64)
	default:
		n, err := strconv.ParseInt(s, 10, t.Bits())
		return float64(n), err
	}
}

// usage is the text flag.PrintDefaults shows. The back-quoted word becomes the
// flag's placeholder ("-home string").
func (f *field) usage() string {
	var notes []string
	if len(f.oneof) > 0 {
		notes = append(notes, "one of "+strings.Join(f.oneof, "|"))
	}
	if b := f.bounds(); b != "" {
		notes = append(notes, b)
	}
	if f.env != "" {
		notes = append(notes, "env "+f.env)
	}
	if f.required {
		notes = append(notes, "required")
	}
	var b strings.Builder
	b.WriteString(f.help)
	if kind := f.placeholder(); kind != "" && !strings.Contains(f.help, "`") {
		notes = append([]string{"`" + kind + "`"}, notes...)
	}
	if len(notes) > 0 {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		b.WriteString("(" + strings.Join(notes, ", ") + ")")
	}
	return b.String()
}

func (f *field) placeholder() string {
	t := f.target.Type()
	switch {
	case t == durationType:
		return "duration"
	case t.Kind() == reflect.Bool:
		return ""
	case t.Kind() == reflect.Slice:
		return "list"
	case f.unit != "":
		return f.unit
	case t.Kind() == reflect.Float64:
		return "number"
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		return "int"
	}
	return "string"
}

// bounds describes min and max for messages, e.g. ">= 0" or "between 1 and 10".
func (f *field) bounds() string {
	format := func(n float64) string {
		if f.target.Type() == durationType {
			return time.Duration(n).String()
		}
		return strconv.FormatFloat(n, 'f', -1, 64)
	}
	switch {
	case f.min != nil && f.max != nil:
		return "between " + format(*f.min) + " and " + format(*f.max)
	case f.min != nil:
		return ">= " + format(*f.min)
	case f.max != nil:
		return "<= " + format(*f.max)
	}
	return ""
}

// want says what a valid value looks like, for error messages.
func (f *field) want() string {
	t := f.target.Type()
	var w string
	switch {
	case len(f.oneof) > 0 && t.Kind() == reflect.Slice:
		return "want a comma-separated list of " + strings.Join(f.oneof, "|")
	case len(f.oneof) > 0:
		return "want one of " + strings.Join(f.oneof, "|")
	case t == durationType:
		w = "want a duration such as 90s or 5m"
	case t.Kind() == reflect.Bool:
		return "want true or false"
	case t.Kind() == reflect.Float64:
		w = "want a number"
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		w = "want a whole number"
	default:
		return "want a valid value"
	}
	if f.unit != "" {
		w += " of " + f.unit
	}
	if b := f.bounds(); b != "" {
		w += " (" + b + ")"
	}
	return w
}

// resolve picks the raw value by precedence, then parses and validates it
// into the target field. A field with no flag, no variable and no default
// keeps the value it had.
func (f *field) resolve(lookupEnv func(string) (string, bool)) error {
	raw, source, found := f.lookup(lookupEnv)
	if f.required && (!found || blank(raw, f.target.Kind() == reflect.Slice)) {
		return f.errRequired()
	}
	if !found {
		return nil
	}
	err := f.set(raw)
	switch {
	case err == nil:
		return nil
	case source == "":
		return fmt.Errorf("config: field %s: default %q: %s", f.goName, raw, f.want())
	case errors.Is(err, errHome):
		return fmt.Errorf("%s=%q: %w", source, raw, err)
	default:
		return fmt.Errorf("%s=%q: %s", source, raw, f.want())
	}
}

// lookup returns the raw value and where it came from ("" for the default).
func (f *field) lookup(lookupEnv func(string) (string, bool)) (raw, source string, found bool) {
	if f.value.set {
		return f.value.raw, "-" + f.flag, true
	}
	if f.env != "" {
		if v, ok := lookupEnv(f.env); ok && v != "" {
			return v, f.env, true
		}
	}
	if f.hasDef {
		return f.def, "", true
	}
	return "", "", false
}

// blank reports whether raw holds no value: empty, or for lists no item.
func blank(raw string, list bool) bool {
	if !list {
		return raw == ""
	}
	for item := range strings.SplitSeq(raw, ",") {
		if strings.TrimSpace(item) != "" {
			return false
		}
	}
	return true
}

func (f *field) errRequired() error {
	return fmt.Errorf("%s is required", f.name())
}

// name is how errors refer to the field: its environment variable, else its flag.
func (f *field) name() string {
	if f.env != "" {
		return f.env
	}
	return "-" + f.flag
}

var errHome = errors.New("cannot expand ~ to the home directory")

func (f *field) set(raw string) error {
	t := f.target.Type()
	switch {
	case t == durationType:
		d, err := time.ParseDuration(raw)
		if err != nil || !f.inBounds(float64(d)) {
			return errInvalid
		}
		f.target.SetInt(int64(d))
	case t.Kind() == reflect.String:
		if len(f.oneof) > 0 && !contains(f.oneof, raw) {
			return errInvalid
		}
		s, err := f.expand(raw)
		if err != nil {
			return err
		}
		f.target.SetString(s)
	case t.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return errInvalid
		}
		f.target.SetBool(b)
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, t.Bits())
		if err != nil || !f.inBounds(float64(n)) {
			return errInvalid
		}
		f.target.SetInt(n)
	case t.Kind() == reflect.Float64:
		n, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
		if err != nil || math.IsNaN(n) || math.IsInf(n, 0) || !f.inBounds(n) {
			return errInvalid
		}
		f.target.SetFloat(n)
	case t.Kind() == reflect.Slice:
		var items []string
		for item := range strings.SplitSeq(raw, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			if len(f.oneof) > 0 && !contains(f.oneof, item) {
				return errInvalid
			}
			item, err := f.expand(item)
			if err != nil {
				return err
			}
			items = append(items, item)
		}
		s := reflect.MakeSlice(t, len(items), len(items))
		for i, item := range items {
			s.Index(i).SetString(item)
		}
		f.target.Set(s)
	}
	return nil
}

var errInvalid = errors.New("invalid value")

func (f *field) inBounds(n float64) bool {
	return (f.min == nil || n >= *f.min) && (f.max == nil || n <= *f.max)
}

func (f *field) expand(s string) (string, error) {
	if !f.homePath || (s != "~" && !strings.HasPrefix(s, "~/")) {
		return s, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("%w: %w", errHome, err)
	}
	return home + s[1:], nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// flagValue records the raw text given on the command line; parsing and
// validation happen in resolve so that flags and environment variables get
// the same checks and messages.
type flagValue struct {
	raw    string
	set    bool
	isBool bool
}

func (v *flagValue) String() string {
	if v == nil {
		return ""
	}
	return v.raw
}

func (v *flagValue) Set(s string) error {
	v.raw, v.set = s, true
	return nil
}

// IsBoolFlag lets "-flag" stand for "-flag=true" on bool fields.
func (v *flagValue) IsBoolFlag() bool { return v != nil && v.isBool }
