package main

import "flag"

// flagSet reports whether the flag name was given on the command line (as
// opposed to holding its default).
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
