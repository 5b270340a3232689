package indexes

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ivs builds the expected interval list of a set; nil is the empty set.
func ivs(pairs ...int) []Interval {
	var out []Interval
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, Interval{pairs[i], pairs[i+1]})
	}
	return out
}

func intervalsOf(s Set) []Interval {
	return slices.Collect(s.Intervals())
}

func TestParse(t *testing.T) {
	cases := map[string]struct {
		in            string
		wantIntervals []Interval
		wantString    string
	}{
		"empty string is the empty set": {
			in: "", wantString: "",
		},
		"single index": {
			in: "7", wantIntervals: ivs(7, 7), wantString: "7",
		},
		"zero": {
			in: "0", wantIntervals: ivs(0, 0), wantString: "0",
		},
		"canonical mix of indexes and ranges": {
			in: "1,3-5,7", wantIntervals: ivs(1, 1, 3, 5, 7, 7), wantString: "1,3-5,7",
		},
		"two consecutive indexes as a pair": {
			in: "1,2", wantIntervals: ivs(1, 2), wantString: "1,2",
		},
		"two-index range is canonicalised to a pair": {
			in: "1-2", wantIntervals: ivs(1, 2), wantString: "1,2",
		},
		"adjacent range and index are merged": {
			in: "1-3,4", wantIntervals: ivs(1, 4), wantString: "1-4",
		},
		"adjacent index and range are merged": {
			in: "0,1-3", wantIntervals: ivs(0, 3), wantString: "0-3",
		},
		"adjacent ranges are merged": {
			in: "0-2,3-5,6-9", wantIntervals: ivs(0, 9), wantString: "0-9",
		},
		"three single indexes are merged into a range": {
			in: "4,5,6", wantIntervals: ivs(4, 6), wantString: "4-6",
		},
		"leading zeros are accepted and dropped": {
			in: "007,010-012", wantIntervals: ivs(7, 7, 10, 12), wantString: "7,10-12",
		},
		"largest index": {
			in: "2147483646", wantIntervals: ivs(MaxIndex, MaxIndex), wantString: "2147483646",
		},
		"full range": {
			in: "0-2147483646", wantIntervals: ivs(0, MaxIndex), wantString: "0-2147483646",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if err != nil {
				t.Fatalf("Parse(%q) failed: %v", tc.in, err)
			}
			if diff := cmp.Diff(tc.wantIntervals, intervalsOf(got)); diff != "" {
				t.Errorf("Parse(%q) intervals (-want,+got):\n%s", tc.in, diff)
			}
			if s := got.String(); s != tc.wantString {
				t.Errorf("Parse(%q).String() = %q, want %q", tc.in, s, tc.wantString)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	cases := map[string]struct {
		in         string
		wantOffset int
		wantReason string // a substring of ParseError.Reason
	}{
		"lone comma":                         {in: ",", wantOffset: 0, wantReason: "empty interval"},
		"leading comma":                      {in: ",1", wantOffset: 0, wantReason: "empty interval"},
		"trailing comma":                     {in: "1,", wantOffset: 2, wantReason: "empty interval"},
		"double comma":                       {in: "1,,3", wantOffset: 2, wantReason: "empty interval"},
		"letter":                             {in: "1,a", wantOffset: 2, wantReason: `unexpected character 'a'`},
		"letter after digits":                {in: "12x", wantOffset: 2, wantReason: `unexpected character 'x'`},
		"negative index":                     {in: "-1", wantOffset: 0, wantReason: "cannot be negative"},
		"negative index after a valid one":   {in: "0,-1", wantOffset: 2, wantReason: "cannot be negative"},
		"negative last index":                {in: "1--3", wantOffset: 2, wantReason: "more than one '-'"},
		"leading plus":                       {in: "+1", wantOffset: 0, wantReason: `unexpected character '+'`},
		"plus on last index":                 {in: "1-+3", wantOffset: 2, wantReason: `unexpected character '+'`},
		"leading space":                      {in: " 1", wantOffset: 0, wantReason: `unexpected character ' '`},
		"space after comma":                  {in: "1, 3", wantOffset: 2, wantReason: `unexpected character ' '`},
		"trailing newline":                   {in: "1\n", wantOffset: 1, wantReason: `unexpected character '\n'`},
		"non-ASCII digit":                    {in: "1,٣", wantOffset: 2, wantReason: "unexpected character"},
		"missing last index":                 {in: "1-", wantOffset: 2, wantReason: "missing last index"},
		"lone dash":                          {in: "-", wantOffset: 0, wantReason: "missing index before '-'"},
		"three-part range":                   {in: "1-2-3", wantOffset: 3, wantReason: "more than one '-'"},
		"decreasing range":                   {in: "5-3", wantOffset: 2, wantReason: "first index 5 is greater than last index 3"},
		"range with equal ends":              {in: "3-3", wantOffset: 2, wantReason: "equal ends"},
		"decreasing indexes":                 {in: "3,1", wantOffset: 2, wantReason: "increasing order"},
		"repeated index":                     {in: "1,1", wantOffset: 2, wantReason: "increasing order"},
		"index inside previous range":        {in: "1-5,3", wantOffset: 4, wantReason: "not after the end of the previous interval (5)"},
		"overlapping ranges":                 {in: "1-5,5-7", wantOffset: 4, wantReason: "must not overlap"},
		"range starting before previous one": {in: "4-6,1-9", wantOffset: 4, wantReason: "increasing order"},
		"index above MaxIndex":               {in: "2147483647", wantOffset: 0, wantReason: "greater than the largest completion index"},
		"huge number does not overflow":      {in: "99999999999999999999999", wantOffset: 0, wantReason: "greater than the largest completion index"},
		"huge number then a letter":          {in: "99999999999999999999999z", wantOffset: 23, wantReason: "unexpected character 'z'"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if err == nil {
				t.Fatalf("Parse(%q) = %q, want an error", tc.in, got)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse(%q) error %v is a %T, want *ParseError", tc.in, err, err)
			}
			if pe.Offset != tc.wantOffset {
				t.Errorf("Parse(%q) error offset = %d, want %d (error: %v)", tc.in, pe.Offset, tc.wantOffset, err)
			}
			if !strings.Contains(pe.Reason, tc.wantReason) {
				t.Errorf("Parse(%q) error reason = %q, want it to contain %q", tc.in, pe.Reason, tc.wantReason)
			}
			if got.Count() != 0 {
				t.Errorf("Parse(%q) returned a non-empty set %q with its error", tc.in, got)
			}
		})
	}
}

func TestParseErrorMessage(t *testing.T) {
	_, err := Parse("1,3-5,9-7")
	want := `invalid index list: interval "9-7" at offset 8: first index 9 is greater than last index 7`
	if err == nil || err.Error() != want {
		t.Errorf("Parse error = %v, want %q", err, want)
	}
}

func TestParseErrorShortensLongFragments(t *testing.T) {
	long := strings.Repeat("1", 60) + "x"
	_, err := Parse(long)
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("Parse error = %v, want a *ParseError", err)
	}
	if len(pe.Fragment) > 50 || !strings.HasSuffix(pe.Fragment, "...") {
		t.Errorf("Fragment = %q, want it shortened with \"...\"", pe.Fragment)
	}
}

func TestParseWithin(t *testing.T) {
	cases := map[string]struct {
		in          string
		completions int32
		wantString  string
		wantErr     string // a substring of the error; empty when none
	}{
		"empty string with zero completions":  {in: "", completions: 0, wantString: ""},
		"all indexes below completions":       {in: "0,2-4", completions: 5, wantString: "0,2-4"},
		"last index is completions minus one": {in: "4", completions: 5, wantString: "4"},
		"single index equal to completions":   {in: "5", completions: 5, wantErr: "index 5 is not below completions (5)"},
		"range end equal to completions":      {in: "1,3-5", completions: 5, wantErr: "index 5 is not below completions (5)"},
		"range start above completions":       {in: "7-9", completions: 5, wantErr: "index 7 is not below completions (5)"},
		"any index with zero completions":     {in: "0", completions: 0, wantErr: "not below completions (0)"},
		"malformed input is still reported":   {in: "1,,2", completions: 5, wantErr: "empty interval"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseWithin(tc.in, tc.completions)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseWithin(%q, %d) error = %v, want one containing %q", tc.in, tc.completions, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseWithin(%q, %d) failed: %v", tc.in, tc.completions, err)
			}
			if got.String() != tc.wantString {
				t.Errorf("ParseWithin(%q, %d) = %q, want %q", tc.in, tc.completions, got, tc.wantString)
			}
		})
	}
}

func TestString(t *testing.T) {
	cases := map[string]struct {
		set  Set
		want string
	}{
		"zero value":                 {set: Set{}, want: ""},
		"single index":               {set: Of(3), want: "3"},
		"run of two written as pair": {set: Of(3, 4), want: "3,4"},
		"run of three as range":      {set: Of(3, 4, 5), want: "3-5"},
		"pairs and ranges mixed":     {set: Of(0, 1, 3, 5, 6, 7, 9, 10), want: "0,1,3,5-7,9,10"},
		"every other index":          {set: Of(0, 2, 4, 6), want: "0,2,4,6"},
		"large indexes":              {set: Of(99998, 99999, 100000), want: "99998-100000"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tc.set.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestOf(t *testing.T) {
	cases := map[string]struct {
		in   []int
		want []Interval
	}{
		"nothing":                        {in: nil, want: nil},
		"unordered with duplicates":      {in: []int{5, 1, 3, 2, 5, 1}, want: ivs(1, 3, 5, 5)},
		"negative and too large skipped": {in: []int{-1, 0, MaxIndex + 1, MaxIndex}, want: ivs(0, 0, MaxIndex, MaxIndex)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, intervalsOf(Of(tc.in...))); diff != "" {
				t.Errorf("Of(%v) (-want,+got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestAdd(t *testing.T) {
	cases := map[string]struct {
		start       string
		add         int
		wantString  string
		wantChanged bool
	}{
		"into the empty set":                         {start: "", add: 4, wantString: "4", wantChanged: true},
		"before everything, apart":                   {start: "5-7", add: 1, wantString: "1,5-7", wantChanged: true},
		"after everything, apart":                    {start: "5-7", add: 10, wantString: "5-7,10", wantChanged: true},
		"into a gap, touching nothing":               {start: "1,9", add: 5, wantString: "1,5,9", wantChanged: true},
		"extends an interval's start":                {start: "5-7", add: 4, wantString: "4-7", wantChanged: true},
		"extends an interval's end":                  {start: "5-7", add: 8, wantString: "5-8", wantChanged: true},
		"extends a single index into a pair":         {start: "5", add: 6, wantString: "5,6", wantChanged: true},
		"extends a pair into a range":                {start: "5,6", add: 7, wantString: "5-7", wantChanged: true},
		"extends left neighbour only":                {start: "1-3,9", add: 4, wantString: "1-4,9", wantChanged: true},
		"extends right neighbour only":               {start: "1,6-9", add: 5, wantString: "1,5-9", wantChanged: true},
		"joins neighbours on both sides":             {start: "1-3,5-7", add: 4, wantString: "1-7", wantChanged: true},
		"joins two single indexes":                   {start: "3,5", add: 4, wantString: "3-5", wantChanged: true},
		"joins in the middle of many":                {start: "0,2,4,6,8", add: 5, wantString: "0,2,4-6,8", wantChanged: true},
		"index zero at the start":                    {start: "1-3", add: 0, wantString: "0-3", wantChanged: true},
		"duplicate single index":                     {start: "1,5,9", add: 5, wantString: "1,5,9", wantChanged: false},
		"duplicate inside a range":                   {start: "1-9", add: 5, wantString: "1-9", wantChanged: false},
		"duplicate at a range's start":               {start: "1-9", add: 1, wantString: "1-9", wantChanged: false},
		"duplicate at a range's end":                 {start: "1-9", add: 9, wantString: "1-9", wantChanged: false},
		"negative index is ignored":                  {start: "1", add: -1, wantString: "1", wantChanged: false},
		"index above MaxIndex is ignored":            {start: "1", add: MaxIndex + 1, wantString: "1", wantChanged: false},
		"MaxIndex extends a range ending next to it": {start: "2147483640-2147483645", add: MaxIndex, wantString: "2147483640-2147483646", wantChanged: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := Parse(tc.start)
			if err != nil {
				t.Fatalf("Parse(%q) failed: %v", tc.start, err)
			}
			changed := s.Add(tc.add)
			if changed != tc.wantChanged {
				t.Errorf("Add(%d) = %v, want %v", tc.add, changed, tc.wantChanged)
			}
			if got := s.String(); got != tc.wantString {
				t.Errorf("after Add(%d): %q, want %q", tc.add, got, tc.wantString)
			}
		})
	}
}

func TestAddOnCloneLeavesOriginal(t *testing.T) {
	orig := Of(1, 5)
	c := orig.Clone()
	c.Add(3)
	c.Add(4)
	if got := orig.String(); got != "1,5" {
		t.Errorf("original changed to %q after adding to its clone", got)
	}
	if got := c.String(); got != "1,3-5" {
		t.Errorf("clone = %q, want \"1,3-5\"", got)
	}
}

func TestUnion(t *testing.T) {
	cases := map[string]struct {
		a, b string
		want string
	}{
		"both empty":                   {a: "", b: "", want: ""},
		"empty and non-empty":          {a: "", b: "1,3", want: "1,3"},
		"non-empty and empty":          {a: "1,3", b: "", want: "1,3"},
		"disjoint, interleaved":        {a: "0,4,8", b: "2,6", want: "0,2,4,6,8"},
		"adjacent intervals merge":     {a: "0-2,8", b: "3-5,7", want: "0-5,7,8"},
		"overlapping intervals merge":  {a: "0-5", b: "3-9", want: "0-9"},
		"one contains the other":       {a: "0-100", b: "5,7-9,50", want: "0-100"},
		"identical sets":               {a: "1,3-5", b: "1,3-5", want: "1,3-5"},
		"bridge joins three intervals": {a: "0-2,6-8", b: "3-5", want: "0-8"},
		"one interval spans many":      {a: "1,3,5,7", b: "2-6", want: "1-7"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a, b := mustParse(t, tc.a), mustParse(t, tc.b)
			aBefore, bBefore := a.String(), b.String()
			if got := a.Union(b).String(); got != tc.want {
				t.Errorf("%q ∪ %q = %q, want %q", tc.a, tc.b, got, tc.want)
			}
			if got := b.Union(a).String(); got != tc.want {
				t.Errorf("%q ∪ %q = %q, want %q", tc.b, tc.a, got, tc.want)
			}
			if a.String() != aBefore || b.String() != bBefore {
				t.Errorf("Union modified its operands: %q, %q", a, b)
			}
		})
	}
}

func TestCountLenHas(t *testing.T) {
	cases := map[string]struct {
		in        string
		wantCount int
		wantLen   int
		has       []int
		hasNot    []int
	}{
		"empty":               {in: "", wantCount: 0, wantLen: 0, hasNot: []int{-1, 0, 1}},
		"single index":        {in: "3", wantCount: 1, wantLen: 1, has: []int{3}, hasNot: []int{2, 4}},
		"pair":                {in: "3,4", wantCount: 2, wantLen: 1, has: []int{3, 4}, hasNot: []int{2, 5}},
		"ranges and gaps":     {in: "0,2-4,7-9,20", wantCount: 8, wantLen: 4, has: []int{0, 2, 3, 4, 7, 9, 20}, hasNot: []int{-1, 1, 5, 6, 10, 19, 21}},
		"full range":          {in: "0-2147483646", wantCount: MaxIndex + 1, wantLen: 1, has: []int{0, MaxIndex}, hasNot: []int{-1, MaxIndex + 1}},
		"100k failed indexes": {in: "0-99999", wantCount: 100_000, wantLen: 1, has: []int{99999}, hasNot: []int{100000}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := mustParse(t, tc.in)
			if got := s.Count(); got != tc.wantCount {
				t.Errorf("Count() = %d, want %d", got, tc.wantCount)
			}
			if got := s.Len(); got != tc.wantLen {
				t.Errorf("Len() = %d, want %d", got, tc.wantLen)
			}
			for _, ix := range tc.has {
				if !s.Has(ix) {
					t.Errorf("Has(%d) = false, want true", ix)
				}
			}
			for _, ix := range tc.hasNot {
				if s.Has(ix) {
					t.Errorf("Has(%d) = true, want false", ix)
				}
			}
		})
	}
}

func TestAll(t *testing.T) {
	cases := map[string]struct {
		in   string
		want []int
	}{
		"empty":           {in: "", want: nil},
		"ranges and pair": {in: "1,3-5,8,9", want: []int{1, 3, 4, 5, 8, 9}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, slices.Collect(mustParse(t, tc.in).All())); diff != "" {
				t.Errorf("All() (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestAllStopsEarly(t *testing.T) {
	var got []int
	for ix := range mustParse(t, "0-1000000").All() {
		if ix == 3 {
			break
		}
		got = append(got, ix)
	}
	if diff := cmp.Diff([]int{0, 1, 2}, got); diff != "" {
		t.Errorf("All() with break (-want,+got):\n%s", diff)
	}
}

func TestEqual(t *testing.T) {
	if !mustParse(t, "1-3,4").Equal(mustParse(t, "1-4")) {
		t.Error(`"1-3,4" and "1-4" differ, want equal`)
	}
	if mustParse(t, "1-3").Equal(mustParse(t, "1-4")) {
		t.Error(`"1-3" and "1-4" are equal, want different`)
	}
	if !(Set{}).Equal(mustParse(t, "")) {
		t.Error("zero Set and parsed empty string differ, want equal")
	}
}

func mustParse(t *testing.T, s string) Set {
	t.Helper()
	out, err := Parse(s)
	if err != nil {
		t.Fatalf("Parse(%q) failed: %v", s, err)
	}
	return out
}
