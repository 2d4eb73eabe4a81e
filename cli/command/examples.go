package command

// examples are the Example of every command that does not set its own, by
// command path: applyConventions fills them in.
var examples = map[string]string{
	"hangar": `  hangar up &                                   # run hangar here (see hangar up -h)
  hangar session new demo "add a README" -w     # a session on the repository you are in
  hangar session list
  hangar completion bash > /etc/bash_completion.d/hangar`,
	"hangar session": `  hangar session new onboarding "build the signup form" -w
  hangar session send onboarding "use the existing Button component" -w
  hangar session get onboarding`,
	"hangar session new": `  hangar session new onboarding "build the signup form" -w    # the repository you are in
  hangar session new onboarding -e early-signal                # only create it, on an environment
  hangar session new spike "try it" --repo ../other-checkout   # another repository (a path or URL)
  hangar session new fix "fix the flaky test" --harness codex --max-cost 2 -w`,
	"hangar session send": `  hangar session send onboarding "now add the email verification step" -w
  hangar session send onboarding "answer: use Postgres" --file schema.sql`,
	"hangar session open": `  hangar session open onboarding && hangar sb attach $(hangar session get onboarding -o json | jq -r .sandbox_id)`,
	"hangar session keep": `  hangar session keep onboarding --idle 240   # four hours
  hangar session keep onboarding --idle 0     # stay up until I suspend it`,
	"hangar session suspend":   `  hangar session suspend onboarding`,
	"hangar session archive":   `  hangar session archive onboarding`,
	"hangar session pull":      "  hangar session pull onboarding              # its commits onto branch hangar/onboarding\n  hangar session pull onboarding --checkout   # and switch to it, with its uncommitted changes",
	"hangar session steer":     `  hangar session steer onboarding "stop editing the tests"`,
	"hangar session interrupt": "  hangar session interrupt onboarding\n  hangar session interrupt onboarding \"do the backend first\" -w",
	"hangar session fork": `  hangar session fork onboarding -n 3 "try the email step with magic links instead" -w
  hangar session fork onboarding -n 2 --name onboarding-a --name onboarding-b`,
	"hangar session approvals": "  hangar session approvals onboarding\n  hangar session approvals onboarding --allow appr-1a2b3c",
	"hangar sb":                "  hangar sb list\n  hangar sb exec sb-0d385863ed99 -- git status\n  hangar sb attach sb-0d385863ed99",
	"hangar sb exec":           "  hangar sb exec sb-0d385863ed99 -- git status\n  hangar sb exec sb-0d385863ed99 --env CI=1 -- make test",
	"hangar sb attach":         "  hangar sb attach sb-0d385863ed99\n  hangar sb attach sb-0d385863ed99 -- bash -l",
	"hangar env":               "  hangar env list\n  hangar env get local\n  hangar env apply -f web.yaml",
	"hangar env apply":         "  hangar env apply -f web.yaml\n  hangar env get web | sed 's/warm_pool_size: 0/warm_pool_size: 2/' | hangar env apply -f -",
	"hangar checkpoint":        "  hangar checkpoint list onboarding\n  hangar checkpoint verify onboarding",
	"hangar checkpoint verify": "  hangar checkpoint verify onboarding   # every checkpoint of the session",
	"hangar job":               "  hangar job run --best-of 3 --check 'make test' --session onboarding \"fix the flaky test\" -w\n  hangar job list",
	"hangar job run":           "  hangar job run --best-of 3 --check 'make test' --session onboarding \"fix the flaky test\" -w",
	"hangar fake-model":        "  hangar fake-model --script script.yaml --addr 127.0.0.1:8080",
}
