// chart-render renders a Helm chart's templates the way `helm template` does, for make test on
// machines where the Helm binary cannot be installed (it is in neither Debian's archive nor the
// npm registry). The templates run in Go's text/template with the Sprig function library (what
// Helm runs them in; both from Debian's packages), plus the functions Helm itself adds, written
// here after Helm's pkg/engine: include, tpl, required, toYaml, fromYaml, toJson, fromJson and a
// lookup that finds nothing (as `helm template` without a cluster). The data is Helm's:
// .Values (values.yaml, then each -f file merged over it), .Release, .Chart, .Capabilities and
// .Template. What it does not do: hooks, subcharts, .Files, CRDs and Helm's values schema check
// (tools/k8s-validate.mjs validates the values against values.schema.json with Ajv).
//
// Usage: chart-render [-f values.yaml]... [-n namespace] [-r release] CHART_DIR > manifests.yaml
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

// normalize turns yaml.v3's map[string]interface{} trees into what JSON would give (Helm reads
// values through JSON: numbers are float64), so templates see the types Helm gives them.
func normalize(v interface{}) interface{} {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out interface{}
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

func readYAML(path string) (map[string]interface{}, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	n, _ := normalize(m).(map[string]interface{})
	if n == nil {
		n = map[string]interface{}{}
	}
	return n, nil
}

// merge copies src over dst, maps merged key by key (Helm's coalescing of -f files).
func merge(dst, src map[string]interface{}) {
	for k, v := range src {
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(normalize(v)); err != nil {
		return ""
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

func main() {
	var valueFiles files
	flag.Var(&valueFiles, "f", "values file merged over the chart's values.yaml (repeatable)")
	namespace := flag.String("n", "default", "release namespace")
	release := flag.String("r", "kiln", "release name")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: chart-render [-f values.yaml]... [-n namespace] [-r release] CHART_DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	if err := render(dir, valueFiles, *namespace, *release); err != nil {
		fmt.Fprintln(os.Stderr, "chart-render:", err)
		os.Exit(1)
	}
}

func render(dir string, valueFiles []string, namespace, release string) error {
	chartMeta, err := readYAML(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return err
	}
	values, err := readYAML(filepath.Join(dir, "values.yaml"))
	if err != nil {
		return err
	}
	for _, f := range valueFiles {
		v, err := readYAML(f)
		if err != nil {
			return err
		}
		merge(values, v)
	}
	// Helm gives .Chart the Chart.yaml fields with capitalised names.
	chart := map[string]interface{}{}
	for k, v := range chartMeta {
		chart[strings.ToUpper(k[:1])+k[1:]] = v
	}
	name, _ := chart["Name"].(string)
	top := map[string]interface{}{
		"Values": values,
		"Release": map[string]interface{}{"Name": release, "Namespace": namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1},
		"Chart": chart,
		"Capabilities": map[string]interface{}{
			"KubeVersion": map[string]interface{}{"Version": "v1.29.0", "Major": "1", "Minor": "29"},
			"APIVersions": []string{}},
	}

	paths, err := filepath.Glob(filepath.Join(dir, "templates", "*"))
	if err != nil {
		return err
	}
	sort.Strings(paths)
	t := template.New("gotpl").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	includedNames := map[string]int{}
	funcs["include"] = func(n string, data interface{}) (string, error) {
		if includedNames[n] > 100 {
			return "", errors.New("rendering template has a nested reference name: " + n)
		}
		includedNames[n]++
		var buf bytes.Buffer
		err := t.ExecuteTemplate(&buf, n, data)
		includedNames[n]--
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		nt, err := t.Clone()
		if err != nil {
			return "", err
		}
		nt, err = nt.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = nt.Execute(&buf, data)
		return buf.String(), err
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil || v == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	funcs["toJson"] = func(v interface{}) string { b, _ := json.Marshal(v); return string(b) }
	funcs["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	funcs["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	t.Funcs(funcs)
	base := filepath.Join(name, "templates")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if _, err := t.New(filepath.Join(base, filepath.Base(p))).Parse(string(b)); err != nil {
			return err
		}
	}
	out := os.Stdout
	for _, p := range paths {
		fname := filepath.Base(p)
		if strings.HasPrefix(fname, "_") || fname == "NOTES.txt" {
			continue
		}
		tname := filepath.Join(base, fname)
		data := map[string]interface{}{}
		for k, v := range top {
			data[k] = v
		}
		data["Template"] = map[string]interface{}{"Name": tname, "BasePath": base}
		var buf bytes.Buffer
		if err := t.ExecuteTemplate(&buf, tname, data); err != nil {
			return err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if strings.TrimSpace(text) == "" {
			continue
		}
		fmt.Fprintf(out, "---\n# Source: %s\n%s\n", tname, strings.TrimSpace(text))
	}
	return nil
}
