package eventsctl

import "flag"

// credential is the value of a flag that may carry a credential (a URL
// with its password, a signing secret), whose default comes from the
// environment. -h prints every flag's default with its value's String, so
// this String says nothing: the help names the variable instead, and the
// value never reaches a terminal or a CI log (DESIGN.md, rule 7).
type credential string

func (c *credential) String() string { return "" }

func (c *credential) Set(v string) error {
	*c = credential(v)
	return nil
}

// credentialVar is fs.StringVar for a flag whose value may carry a
// credential: -h does not print its default, value.
func credentialVar(fs *flag.FlagSet, p *string, name, value, usage string) {
	*p = value
	fs.Var((*credential)(p), name, usage)
}

// credentialFlag is fs.String for a flag whose value may carry a
// credential: -h does not print its default, value.
func credentialFlag(fs *flag.FlagSet, name, value, usage string) *string {
	p := new(string)
	credentialVar(fs, p, name, value, usage)
	return p
}
