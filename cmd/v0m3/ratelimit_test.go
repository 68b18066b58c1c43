package main

import (
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/v0m3/v0m3/internal/identity"
)

// TestCallerRateFlags: the flags give the default limits unless set, read
// group limits, and refuse what they cannot read with a usage error.
func TestCallerRateFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want identity.RateLimits
		bad  bool
	}{
		{name: "defaults", want: identity.DefaultRateLimits},
		{name: "off", args: []string{"--caller-rate", "0", "--caller-rate-groups", ""},
			want: identity.RateLimits{Default: identity.RateLimit{Burst: 100}, Groups: map[string]identity.RateLimit{}}},
		{name: "groups", args: []string{"--caller-rate", "2.5", "--caller-burst", "5", "--caller-rate-groups", "product-services=0, batch=10:20"},
			want: identity.RateLimits{Default: identity.RateLimit{PerSecond: 2.5, Burst: 5}, Groups: map[string]identity.RateLimit{"product-services": {}, "batch": {PerSecond: 10, Burst: 20}}}},
		{name: "negative rate", args: []string{"--caller-rate", "-1"}, bad: true},
		{name: "no burst", args: []string{"--caller-burst", "0"}, bad: true},
		{name: "group without a burst", args: []string{"--caller-rate-groups", "batch=10"}, bad: true},
		{name: "group without a name", args: []string{"--caller-rate-groups", "=10:20"}, bad: true},
		{name: "group rate not a number", args: []string{"--caller-rate-groups", "batch=fast:20"}, bad: true},
		{name: "group rate not finite", args: []string{"--caller-rate-groups", "batch=NaN:20"}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := newFlags("test", io.Discard)
			f := addCallerRateFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := f.limits()
			if tc.bad {
				var ue usageError
				if !errors.As(err, &ue) {
					t.Fatalf("limits() = %v, %v; want a usage error", got, err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("limits() = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
