#include "cmd/vllmctl/completion.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <sstream>
#include <vector>

namespace vllmd::vllmctl {

namespace {

// What the scripts need of one flag.
struct Flag {
  std::vector<std::string> names;  // "-o", "--output"
  std::string help;
  bool takes_value = false;
  bool files = false;                // its value is a file name (type FILE)
  std::vector<std::string> choices;  // the values its check allows ("{abort,wait,keep}")
};

// What the scripts need of one command: "" is vllmctl itself, whose flags are the global ones
// (accepted anywhere on the line).
struct Command {
  std::string path;                                              // "weights init"
  std::vector<std::pair<std::string, std::string>> subcommands;  // name, description
  std::vector<Flag> flags;
  std::vector<std::string> positional_choices;  // `completion SHELL`
};

std::vector<std::string> choices_in(const std::string& type_name) {
  std::vector<std::string> choices;
  const std::size_t open = type_name.find('{');
  const std::size_t close = type_name.find('}', open);
  if (open == std::string::npos || close == std::string::npos) return choices;
  std::stringstream list(type_name.substr(open + 1, close - open - 1));
  for (std::string choice; std::getline(list, choice, ',');) choices.push_back(choice);
  return choices;
}

Flag flag_of(const CLI::Option& option) {
  Flag flag;
  for (const std::string& name : option.get_snames()) flag.names.push_back("-" + name);
  for (const std::string& name : option.get_lnames()) flag.names.push_back("--" + name);
  flag.help = option.get_description();
  flag.takes_value = option.get_expected_max() > 0;  // flags expect none
  const std::string type = option.get_type_name();
  flag.files = type.rfind("FILE", 0) == 0;
  flag.choices = choices_in(type);
  return flag;
}

void collect(const CLI::App& app, const std::string& path, std::vector<Command>& commands) {
  Command command{path, {}, {}, {}};
  for (const CLI::Option* option : app.get_options()) {
    // Every command's own --help is the global one.
    if (option == app.get_help_ptr() && !path.empty()) continue;
    if (option->nonpositional()) {
      command.flags.push_back(flag_of(*option));
    } else {
      command.positional_choices = choices_in(option->get_type_name());
    }
  }
  const auto subcommands = app.get_subcommands([](const CLI::App*) { return true; });
  for (const CLI::App* sub : subcommands) {
    command.subcommands.emplace_back(sub->get_name(), sub->get_description());
  }
  commands.push_back(std::move(command));
  for (const CLI::App* sub : subcommands) {
    collect(*sub, path.empty() ? sub->get_name() : path + " " + sub->get_name(), commands);
  }
}

std::string joined(const std::vector<std::string>& words, std::string_view separator) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : std::string(separator)) + word;
  return text;
}

// 'text' for sh-like shells: a quote inside becomes '\''.
std::string sh_quoted(std::string_view text) {
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// 'text' for fish, whose single quotes take \' and \\.
std::string fish_quoted(std::string_view text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "'";
}

// The pieces the bash and zsh scripts share: case patterns over the command words.
struct Patterns {
  std::string value_flags;  // every flag that takes a value: --a|--b
  std::string paths;        // every command path: "weights"|"weights init"
};

Patterns patterns_of(const std::vector<Command>& commands) {
  Patterns patterns;
  std::vector<std::string> value_flags;
  std::vector<std::string> paths;
  for (const Command& command : commands) {
    if (!command.path.empty()) paths.push_back("\"" + command.path + "\"");
    for (const Flag& flag : command.flags) {
      if (!flag.takes_value) continue;
      for (const std::string& name : flag.names) {
        if (std::find(value_flags.begin(), value_flags.end(), name) == value_flags.end()) {
          value_flags.push_back(name);
        }
      }
    }
  }
  patterns.value_flags = joined(value_flags, "|");
  patterns.paths = joined(paths, "|");
  return patterns;
}

// The loop that finds the command path among the words before the cursor (bash and zsh
// index words alike once `first` and `end` are given).
std::string path_loop(const Patterns& patterns, std::string_view first, std::string_view end,
                      std::string_view open_paren) {
  std::ostringstream out;
  out << "  local i cmdpath=\"\" next positionals=0\n"
      << "  for ((i = " << first << "; i < " << end << "; i++)); do\n"
      << "    case ${words[i]} in\n"
      << "      " << open_paren << patterns.value_flags << ") ((i++)) ;;\n"
      << "      " << open_paren << "-*) ;;\n"
      << "      " << open_paren << "*)\n"
      << "        next=${cmdpath:+$cmdpath }${words[i]}\n"
      << "        case $next in\n"
      << "          " << open_paren << patterns.paths << ") cmdpath=$next ;;\n"
      << "          " << open_paren << "*) ((positionals++)) ;;\n"
      << "        esac\n"
      << "        ;;\n"
      << "    esac\n"
      << "  done\n";
  return out.str();
}

// "weights init:--info" patterns (any path for global flags) for the flags whose values
// complete as `files`, as `choices`, or not at all.
struct ValueArms {
  std::vector<std::string> files;
  std::vector<std::pair<std::string, std::string>> choices;  // patterns, words
  std::vector<std::string> none;
};

ValueArms value_arms(const std::vector<Command>& commands) {
  ValueArms arms;
  for (const Command& command : commands) {
    for (const Flag& flag : command.flags) {
      if (!flag.takes_value) continue;
      std::vector<std::string> patterns;
      for (const std::string& name : flag.names) {
        patterns.push_back((command.path.empty() ? "*" : "\"" + command.path + "\"") + ":" + name);
      }
      const std::string pattern = joined(patterns, "|");
      if (flag.files) {
        arms.files.push_back(pattern);
      } else if (!flag.choices.empty()) {
        arms.choices.emplace_back(pattern, joined(flag.choices, " "));
      } else {
        arms.none.push_back(pattern);
      }
    }
  }
  return arms;
}

std::vector<std::string> flag_names(const std::vector<Flag>& flags) {
  std::vector<std::string> names;
  for (const Flag& flag : flags) names.insert(names.end(), flag.names.begin(), flag.names.end());
  return names;
}

std::string bash_script(const std::vector<Command>& commands) {
  const ValueArms arms = value_arms(commands);
  std::ostringstream out;
  out << "# bash completion for vllmctl, the weight-sync CLI of vllmd. Generated by `vllmctl\n"
      << "# completion bash` from its command line definition. Install as\n"
      << "# /usr/share/bash-completion/completions/vllmctl, or: source <(vllmctl completion "
         "bash)\n\n"
      << "_vllmctl() {\n"
      << "  local cur prev words cword\n"
      << "  if declare -F _init_completion >/dev/null 2>&1; then\n"
      << "    _init_completion || return\n"
      << "  else\n"
      << "    cur=${COMP_WORDS[COMP_CWORD]}\n"
      << "    prev=${COMP_WORDS[COMP_CWORD - 1]}\n"
      << "    words=(\"${COMP_WORDS[@]}\")\n"
      << "    cword=$COMP_CWORD\n"
      << "  fi\n"
      << path_loop(patterns_of(commands), "1", "cword", "") << "\n"
      << "  case \"$cmdpath:$prev\" in\n";
  if (!arms.files.empty()) {
    out << "    " << joined(arms.files, "|") << ")\n"
        << "      compopt -o filenames 2>/dev/null\n"
        << "      COMPREPLY=($(compgen -f -- \"$cur\"))\n"
        << "      return\n"
        << "      ;;\n";
  }
  for (const auto& [pattern, words] : arms.choices) {
    out << "    " << pattern << ") COMPREPLY=($(compgen -W \"" << words
        << "\" -- \"$cur\")); return ;;\n";
  }
  if (!arms.none.empty()) out << "    " << joined(arms.none, "|") << ") return ;;\n";
  out << "  esac\n\n"
      << "  local candidates=\"\"\n"
      << "  case $cmdpath in\n";
  for (const Command& command : commands) {
    std::vector<std::string> words;
    for (const auto& sub : command.subcommands) words.push_back(sub.first);
    if (!command.path.empty()) {
      const std::vector<std::string> own = flag_names(command.flags);
      words.insert(words.end(), own.begin(), own.end());
    }
    const std::string choices = joined(command.positional_choices, " ");
    out << "    \"" << command.path << "\") candidates=\"" << joined(words, " ") << "\"";
    if (!choices.empty()) out << "; ((positionals == 0)) && candidates=\"" << choices << "\"";
    out << " ;;\n";
  }
  out << "  esac\n"
      << "  # Global flags are accepted anywhere on the line.\n"
      << "  [[ $cur == -* ]] && candidates=\"$candidates "
      << joined(flag_names(commands[0].flags), " ") << "\"\n"
      << "  COMPREPLY=($(compgen -W \"$candidates\" -- \"$cur\"))\n"
      << "}\n"
      << "complete -F _vllmctl vllmctl\n";
  return out.str();
}

// 'name:description' entries for zsh's _describe.
std::string zsh_entries(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::vector<std::string> quoted;
  quoted.reserve(entries.size());
  for (const auto& [name, description] : entries) {
    quoted.push_back(sh_quoted(description.empty() ? name : name + ":" + description));
  }
  return joined(quoted, " ");
}

std::vector<std::pair<std::string, std::string>> flag_entries(const std::vector<Flag>& flags) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (const Flag& flag : flags) {
    for (const std::string& name : flag.names) entries.emplace_back(name, flag.help);
  }
  return entries;
}

std::string zsh_script(const std::vector<Command>& commands) {
  const ValueArms arms = value_arms(commands);
  std::ostringstream out;
  out << "#compdef vllmctl\n"
      << "# zsh completion for vllmctl, the weight-sync CLI of vllmd. Generated by `vllmctl\n"
      << "# completion zsh` from its command line definition. Install as _vllmctl in a\n"
      << "# directory of $fpath, or: source <(vllmctl completion zsh)\n\n"
      << "_vllmctl() {\n"
      << "  local prev=${words[CURRENT-1]}\n"
      << path_loop(patterns_of(commands), "2", "CURRENT", "(") << "\n"
      << "  case \"$cmdpath:$prev\" in\n";
  if (!arms.files.empty()) out << "    (" << joined(arms.files, "|") << ") _files; return ;;\n";
  for (const auto& [pattern, words] : arms.choices) {
    out << "    (" << pattern << ") compadd -- " << words << "; return ;;\n";
  }
  if (!arms.none.empty()) {
    out << "    (" << joined(arms.none, "|") << ") _message -e value 'a value'; return ;;\n";
  }
  out << "  esac\n\n"
      << "  local -a commands flags\n"
      << "  flags=(" << zsh_entries(flag_entries(commands[0].flags)) << ")\n"
      << "  case $cmdpath in\n";
  for (const Command& command : commands) {
    out << "    (\"" << command.path << "\")";
    if (!command.subcommands.empty())
      out << " commands=(" << zsh_entries(command.subcommands) << ");";
    if (!command.path.empty() && !command.flags.empty()) {
      out << " flags+=(" << zsh_entries(flag_entries(command.flags)) << ");";
    }
    if (!command.positional_choices.empty()) {
      out << " ((positionals == 0)) && commands=(" << joined(command.positional_choices, " ")
          << ");";
    }
    out << " ;;\n";
  }
  out << "  esac\n"
      << "  if [[ $PREFIX == -* || ${#commands} -eq 0 ]]; then\n"
      << "    _describe -t options option flags\n"
      << "  else\n"
      << "    _describe -t commands command commands\n"
      << "  fi\n"
      << "}\n\n"
      << "if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then\n"
      << "  _vllmctl \"$@\"\n"
      << "else\n"
      << "  compdef _vllmctl vllmctl\n"
      << "fi\n";
  return out.str();
}

// complete -c vllmctl ... for one flag, offered where `condition` holds (empty: anywhere).
std::string fish_flag(const Flag& flag, const std::string& condition) {
  std::string line = "complete -c vllmctl";
  if (!condition.empty()) line += " -n " + fish_quoted(condition);
  for (const std::string& name : flag.names) {
    line += name.rfind("--", 0) == 0 ? " -l " + name.substr(2) : " -s " + name.substr(1);
  }
  if (flag.files) {
    line += " -r -F";
  } else if (!flag.choices.empty()) {
    line += " -x -a " + fish_quoted(joined(flag.choices, " "));
  } else if (flag.takes_value) {
    line += " -x";
  }
  return line + " -d " + fish_quoted(flag.help) + "\n";
}

std::string fish_script(const std::vector<Command>& commands) {
  const Patterns patterns = patterns_of(commands);
  std::vector<std::string> paths;
  for (const Command& command : commands) {
    if (!command.path.empty()) paths.push_back(fish_quoted(command.path));
  }
  std::string value_flags = patterns.value_flags;
  std::replace(value_flags.begin(), value_flags.end(), '|', ' ');
  std::ostringstream out;
  out << "# fish completion for vllmctl, the weight-sync CLI of vllmd. Generated by `vllmctl\n"
      << "# completion fish` from its command line definition. Install as\n"
      << "# /usr/share/fish/vendor_completions.d/vllmctl.fish, or: vllmctl completion fish | "
         "source\n\n"
      << "# The command words typed so far (\"weights init\"), flags and their values skipped.\n"
      << "function __vllmctl_path\n"
      << "    set -l words (commandline -opc)\n"
      << "    set -e words[1]\n"
      << "    set -l path\n"
      << "    set -l skip 0\n"
      << "    for word in $words\n"
      << "        if test $skip = 1\n"
      << "            set skip 0\n"
      << "        else if contains -- $word " << value_flags << "\n"
      << "            set skip 1\n"
      << "        else if not string match -q -- '-*' $word\n"
      << "            and contains -- (string join ' ' $path $word) " << joined(paths, " ") << "\n"
      << "            set path $path $word\n"
      << "        end\n"
      << "    end\n"
      << "    string join ' ' $path\n"
      << "end\n\n"
      << "function __vllmctl_at\n"
      << "    set -l path (__vllmctl_path)\n"
      << "    test \"$path\" = \"$argv[1]\"\n"
      << "end\n\n"
      << "complete -c vllmctl -f\n";
  for (const Flag& flag : commands[0].flags) out << fish_flag(flag, "");
  for (const Command& command : commands) {
    const std::string at = "__vllmctl_at '" + command.path + "'";
    for (const auto& [name, description] : command.subcommands) {
      out << "complete -c vllmctl -n " << fish_quoted(at) << " -a " << fish_quoted(name) << " -d "
          << fish_quoted(description) << "\n";
    }
    if (!command.path.empty()) {
      for (const Flag& flag : command.flags) out << fish_flag(flag, at);
    }
    if (!command.positional_choices.empty()) {
      out << "complete -c vllmctl -n " << fish_quoted(at) << " -a "
          << fish_quoted(joined(command.positional_choices, " ")) << "\n";
    }
  }
  return out.str();
}

}  // namespace

std::string completion_script(const CLI::App& app, std::string_view shell) {
  std::vector<Command> commands;
  collect(app, "", commands);
  if (shell == "zsh") return zsh_script(commands);
  if (shell == "fish") return fish_script(commands);
  return bash_script(commands);
}

}  // namespace vllmd::vllmctl
