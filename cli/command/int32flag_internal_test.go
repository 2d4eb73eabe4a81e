package command

import (
	"math"
	"testing"
	"time"
)

func TestInt32Value(t *testing.T) {
	for _, tt := range []struct {
		in       string
		min, max int32
		want     int32
		wantErr  string
	}{
		{"4", 1, math.MaxInt32, 4, ""},
		{" 8 ", 1, math.MaxInt32, 8, ""},
		{"2147483647", 1, math.MaxInt32, math.MaxInt32, ""},
		{"-2147483648", math.MinInt32, math.MaxInt32, math.MinInt32, ""},
		{"2147483648", 1, math.MaxInt32, 0, "want a whole number from 1 to 2147483647"},
		{"4294967297", 1, math.MaxInt32, 0, "want a whole number from 1 to 2147483647"},
		{"4294967297", math.MinInt32, math.MaxInt32, 0, "want a whole number that fits in 32 bits (-2147483648 to 2147483647)"},
		{"99999999999999999999", 1, math.MaxInt32, 0, "want a whole number from 1 to 2147483647"},
		{"0", 1, math.MaxInt32, 0, "want a whole number from 1 to 2147483647"},
		{"0x10", 1, math.MaxInt32, 0, "want a whole number from 1 to 2147483647"},
		{"1.5", 1, math.MaxInt32, 0, "want a whole number from 1 to 2147483647"},
	} {
		var got int32
		v := &int32Value{p: &got, min: tt.min, max: tt.max}
		err := v.Set(tt.in)
		switch {
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("Set(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
			t.Errorf("Set(%q) = %d, %v; want error %q", tt.in, got, err, tt.wantErr)
		}
	}
}

func TestInt32Seconds(t *testing.T) {
	for _, tt := range []struct {
		in      time.Duration
		want    int32
		wantErr bool
	}{
		{0, 0, false},
		{500 * time.Millisecond, 1, false}, // not 0, which means no limit
		{90 * time.Second, 90, false},
		{90*time.Second + time.Nanosecond, 91, false},
		{time.Duration(math.MaxInt32) * time.Second, math.MaxInt32, false},
		{time.Duration(math.MaxInt32)*time.Second + time.Second, 0, true},
		{1000000 * time.Hour, 0, true},
		{-time.Second, 0, true},
	} {
		got, err := int32Seconds("timeout", tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("int32Seconds(%v) = %d, %v; want %d (error %v)", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
