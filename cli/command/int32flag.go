package command

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// int32Value is a flag whose value goes into an int32 request field. It
// parses the whole text as a number and refuses one outside [min, max]
// rather than converting: `fork -n 4294967297` was int32(4294967297), one
// fork. pflag prints the error as
// `invalid argument "4294967297" for "-n, --n" flag: want a whole number from 1 to 2147483647`.
type int32Value struct {
	p        *int32
	min, max int32
}

// int32Flag registers an int32Value flag (shorthand may be "") holding def.
func int32Flag(fs *pflag.FlagSet, p *int32, name, shorthand string, def, lo, hi int32, usage string) {
	*p = def
	fs.VarP(&int32Value{p: p, min: lo, max: hi}, name, shorthand, usage)
}

func (v *int32Value) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < int64(v.min) || n > int64(v.max) {
		if v.min == math.MinInt32 && v.max == math.MaxInt32 {
			return fmt.Errorf("want a whole number that fits in 32 bits (%d to %d)", v.min, v.max)
		}
		return fmt.Errorf("want a whole number from %d to %d", v.min, v.max)
	}
	*v.p = int32(n)
	return nil
}

func (v *int32Value) String() string {
	if v == nil || v.p == nil {
		return "0"
	}
	return strconv.Itoa(int(*v.p))
}

func (v *int32Value) Type() string { return "int" }

// int32Seconds converts a duration flag to the whole seconds of an int32
// request field, rounding a fraction up (so 500ms is 1s, not 0 meaning
// "no limit"), and refuses what does not fit.
func int32Seconds(flag string, d time.Duration) (int32, error) {
	if d < 0 {
		return 0, fmt.Errorf("--%s %v: want 0 or more", flag, d)
	}
	secs := (d + time.Second - 1) / time.Second
	if secs > math.MaxInt32 {
		return 0, fmt.Errorf("--%s %v: want at most %v", flag, d, time.Duration(math.MaxInt32)*time.Second)
	}
	return int32(secs), nil
}
