package command

// PrintStack is `hangar up`'s banner, for the golden tests.
var PrintStack = printStack
