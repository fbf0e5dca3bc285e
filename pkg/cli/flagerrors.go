package cli

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// flagError is the root's flag error func: every error of parsing the
// command line is bad input (exit 2). A value a flag cannot take is said in
// the tool's words, "--replicas abc: not a whole number": pflag's own
// ("invalid argument "abc" for "--replicas" flag: strconv.ParseInt: parsing
// "abc": invalid syntax") names the Go function that failed, not what the
// flag wants. Other errors (an unknown flag, one without its value) are
// pflag's, which say it well enough.
func flagError(err error) error {
	var invalid *pflag.InvalidValueError
	if !errors.As(err, &invalid) {
		return exitcode.New(exitcode.Usage, err)
	}
	f, value := invalid.GetFlag(), invalid.GetValue()
	name := "--" + f.Name
	if len(f.Name) == 1 {
		name = "-" + f.Name // -v, as kubectl's users type it
	}
	return exitcode.Usagef("%s %s: %s", name, value, valueReason(f.Value.Type(), errors.Unwrap(invalid)))
}

// valueReason says why a value of a flag of this type was refused; cause is
// the flag Value's Set error.
func valueReason(typ string, cause error) string {
	if errors.Is(cause, strconv.ErrRange) {
		return "out of range"
	}
	switch typ {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "not a whole number"
	case "float32", "float64":
		return "not a number"
	case "bool":
		return "not true or false"
	case "duration":
		return "not a duration: want a number with a unit, such as 90s, 20m or 1h30m"
	}
	// The tool's own Values (--dry-run) and the rest say why themselves.
	return fmt.Sprint(cause)
}
