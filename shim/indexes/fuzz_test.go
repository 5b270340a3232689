package indexes

import (
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "0", "1,3-5,7", "1,2", "1-2", "1-3,4", "0,1-3", "0-2,3-5", "007",
		"2147483646", "2147483647", "0-2147483646", "99999999999999999999",
		",", "1,", ",1", "1,,2", "-1", "1-", "-", "1--2", "1-2-3", "5-3", "3-3",
		"3,1", "1,1", "1-5,3", "+1", " 1", "1 ", "1,\t2", "٣", "0x10", "1e3",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := Parse(in)
		if err != nil {
			if s.Count() != 0 {
				t.Errorf("Parse(%q) returned set %q with error %v", in, s, err)
			}
			return
		}

		canon := s.String()
		again, err := Parse(canon)
		if err != nil {
			t.Fatalf("Parse(%q) = %q, which does not parse: %v", in, canon, err)
		}
		if !again.Equal(s) {
			t.Errorf("Parse(%q) = %q, which parses to a different set %q", in, canon, again)
		}
		if again.String() != canon {
			t.Errorf("String() is not idempotent: %q, then %q", canon, again.String())
		}

		var n int
		var rebuilt Set
		prev := -1
		for ix := range s.All() {
			if ix <= prev {
				t.Fatalf("All() of %q yielded %d after %d", canon, ix, prev)
			}
			if !s.Has(ix) {
				t.Errorf("Has(%d) = false for an index All() yielded from %q", ix, canon)
			}
			prev = ix
			n++
			if !rebuilt.Add(ix) {
				t.Fatalf("Add(%d) reported no change while rebuilding %q", ix, canon)
			}
			if n > 100_000 {
				// The other checks hold for long lists too; rebuilding one
				// index at a time just gets too slow for a fuzz iteration.
				return
			}
		}
		if got := s.Count(); got != n {
			t.Errorf("Count() of %q = %d, All() yielded %d", canon, got, n)
		}
		if rebuilt.String() != canon {
			t.Errorf("adding every index of %q to an empty set gives %q", canon, rebuilt)
		}
		if u := s.Union(rebuilt); !u.Equal(s) {
			t.Errorf("%q ∪ itself = %q", canon, u)
		}
	})
}
