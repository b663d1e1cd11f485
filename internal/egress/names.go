package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

const (
	maxNameLen  = 253
	maxLabelLen = 63
)

// MatchName reports whether host name is granted by pattern: an exact name, or "*.rest"
// matching exactly one extra leftmost label. Case-insensitive, a trailing dot ignored.
func MatchName(pattern, name string) bool {
	pattern = asciiLower(strings.TrimSuffix(pattern, "."))
	name = asciiLower(strings.TrimSuffix(name, "."))
	// A '*' in the name is never a host name; without this "*.a.b" would grant itself.
	if name == "" || strings.Contains(name, "*") {
		return false
	}
	rest, wild := strings.CutPrefix(pattern, "*.")
	if !wild {
		return pattern != "" && pattern == name
	}
	label, ok := strings.CutSuffix(name, "."+rest)
	return ok && rest != "" && label != "" && !strings.Contains(label, ".")
}

// ValidPattern checks a dns_name grant: a valid DNS name (labels 1-63 of [a-z0-9-], not
// starting/ending with '-', total ≤253, at least two labels), optionally with one
// leftmost "*."; no IP literals, no other wildcards. Returns an error describing what is
// wrong (used for field violations).
//
// Letters may be upper case (DNS names are case-insensitive; MatchName folds case) and
// one trailing dot is accepted (the fully qualified form). An all-numeric last label is
// refused: that is how IP literals in any of the forms resolvers accept ("10.1",
// "0x7f.1") are kept out.
func ValidPattern(pattern string) error {
	name := strings.TrimSuffix(pattern, ".")
	if name == "" {
		return errors.New("is empty")
	}
	if _, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return errors.New("is an IP address, not a DNS name; use a cidr rule")
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("is %d characters long, more than %d", len(name), maxNameLen)
	}
	rest, wild := strings.CutPrefix(name, "*.")
	labels := strings.Split(rest, ".")
	if len(labels) < 2 {
		if wild {
			return fmt.Errorf("wildcard %q would match every name under the top-level domain %q", pattern, rest)
		}
		return errors.New("needs at least two labels (a name like example.com)")
	}
	for _, l := range labels {
		if err := validLabel(l); err != nil {
			return err
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("last label %q is all digits: not a DNS name (IP literals are not allowed)", last)
	}
	return nil
}

func validLabel(l string) error {
	switch {
	case l == "":
		return errors.New("has an empty label (two dots in a row, or a leading dot)")
	case l == "*":
		return errors.New(`has a wildcard that is not the whole leftmost label ("*.example.com" is the only wildcard form)`)
	case len(l) > maxLabelLen:
		return fmt.Errorf("label %q is %d characters long, more than %d", l, len(l), maxLabelLen)
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Errorf("label %q starts or ends with '-'", l)
	}
	for i := range len(l) {
		switch c := l[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-':
		case c == '*':
			return errors.New(`has a wildcard that is not the whole leftmost label ("*.example.com" is the only wildcard form)`)
		default:
			return fmt.Errorf("label %q has the character %q; only letters, digits and '-' are allowed", l, c)
		}
	}
	return nil
}

// asciiLower folds only ASCII letters: Unicode folding would let a name with, say, the
// Kelvin sign (U+212A) match a pattern with 'k'.
func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, s)
}
