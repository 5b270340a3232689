package nvidia

import (
	"strings"
	"testing"
)

func TestParseAddress(t *testing.T) {
	cases := map[string]struct {
		in, want, wantErr string
	}{
		"kernel and /proc form":              {in: "0000:3b:00.0", want: "0000:3b:00.0"},
		"Xid form, no function":              {in: "0000:3b:00", want: "0000:3b:00.0"},
		"upper case":                         {in: "0000:3B:00.0", want: "0000:3b:00.0"},
		"nvidia-smi's eight-digit domain":    {in: "00000000:3B:00.0", want: "0000:3b:00.0"},
		"five-digit domain kept":             {in: "10000:e1:00.0", want: "10000:e1:00.0"},
		"other function kept":                {in: "0000:3b:00.1", want: "0000:3b:00.1"},
		"old Bus Location, dot before slot":  {in: "0000:01.00.0", want: "0000:01:00.0"},
		"device 1f":                          {in: "0000:10:1f", want: "0000:10:1f.0"},
		"no domain":                          {in: "3b:00.0", wantErr: "domain"},
		"short domain":                       {in: "00:3b:00.0", wantErr: "domain"},
		"nine-digit domain":                  {in: "000000000:3b:00.0", wantErr: "domain"},
		"one-digit bus":                      {in: "0000:3:00.0", wantErr: "bus"},
		"device beyond 1f":                   {in: "0000:3b:20.0", wantErr: "device"},
		"function beyond 7":                  {in: "0000:3b:00.8", wantErr: "function"},
		"empty function":                     {in: "0000:3b:00.", wantErr: "empty function"},
		"two functions":                      {in: "0000:3b:00.0.1", wantErr: "function"},
		"old form without function":          {in: "0000:3b.00", wantErr: "want domain"},
		"not hex":                            {in: "0000:3g:00.0", wantErr: "not hex"},
		"sign is not a digit":                {in: "+000:3b:00.0", wantErr: "not hex"},
		"empty":                              {in: "", wantErr: "want domain"},
		"whitespace is not part of the form": {in: " 0000:3b:00.0", wantErr: "domain"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseAddress(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseAddress(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Fatalf("ParseAddress(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
			}
			// The normalized form parses to itself.
			again, err := ParseAddress(got.String())
			if err != nil || again != got {
				t.Errorf("ParseAddress(%q) = %v, %v; want %v", got.String(), again, err, got)
			}
		})
	}
}
