// Command istioctl is Istio's own istioctl (the istio.io/istio module this
// wrapper module pins) with the commands a runbook for an ambient mesh
// starts with: ztunnel-config (every view, the node proxy found by
// daemonset/ztunnel in the Istio namespace and port-forwarded to) and
// analyze. The commands, their flags and their output are istio's code,
// wired as istioctl's root command wires them; only the other commands are
// left out, so building it costs little beyond what the guard tests of
// this module compile already. make test-node builds it for the real
// node's TestNodeIstioctl.
//
//	istioctl [--kubeconfig FILE] [-i NAMESPACE] ztunnel-config workload|service|policy|certificate|connections|all|log ...
//	istioctl [--kubeconfig FILE] analyze -A [-o json]
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
	"istio.io/istio/istioctl/pkg/analyze"
	"istio.io/istio/istioctl/pkg/cli"
	"istio.io/istio/istioctl/pkg/root"
	"istio.io/istio/istioctl/pkg/ztunnelconfig"
	"istio.io/istio/pkg/config/constants"
	"istio.io/istio/pkg/log"
)

func main() {
	// istioctl's root sets these defaults before it adds its flags.
	viper.SetDefault(cli.FlagIstioNamespace, constants.IstioSystemNamespace)
	viper.SetDefault("xds-port", 15012)

	rootCmd := &cobra.Command{
		Use:               "istioctl",
		Short:             "Istio's istioctl: ztunnel-config and analyze",
		SilenceUsage:      true,
		DisableAutoGenTag: true,
		PersistentPreRunE: func(*cobra.Command, []string) error { return log.Configure(root.LoggingOptions) },
	}
	rootCmd.SetArgs(os.Args[1:])
	ctx := cli.NewCLIContext(cli.AddRootFlags(rootCmd.PersistentFlags()))
	root.LoggingOptions.AttachCobraFlags(rootCmd)
	rootCmd.AddCommand(ztunnelconfig.ZtunnelConfig(ctx), analyze.Analyze(ctx))
	log.EnableKlogWithCobra()
	if err := rootCmd.Execute(); err != nil {
		// analyze returns an error when it found something (exit code 79
		// in istioctl); any failure is non-zero here.
		fmt.Fprintln(os.Stderr, "istioctl:", err)
		os.Exit(1)
	}
}
