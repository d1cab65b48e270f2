# kvpool.bash -- bash completion for the kvpool command.
#
# Installed by `make install` as $(PREFIX)/share/bash-completion/completions/kvpool
# (bash-completion loads it on first use); or `source` it.
#
# Nothing is listed here: the subcommands come from `kvpool help`, each
# command's flags (its own and the configuration keys it reads, as
# --key-name) from `kvpool CMD --help`, asked of the very program being
# completed (the first word: kvpool, ./build/kvpool, ...) once per shell
# and cached, so the completion cannot drift from the program. Candidates
# are one a line (mapfile): file names with spaces stay whole.
#   kvpool <TAB>                 the subcommands, help, version
#   kvpool help <TAB>            config and the subcommands
#   kvpool CMD --<TAB>           CMD's flags
#   --config, --*-file <TAB>     file names; --*-dir <TAB>: directories
#   anything else                file names (put KEY FILE, get KEY FILE)

declare -gA _kvpool_flag_cache 2>/dev/null || true
declare -gA _kvpool_cmd_cache 2>/dev/null || true

# _kvpool_commands PROGRAM: the subcommands `PROGRAM help` lists.
_kvpool_commands()
{
    local prog=$1
    if [[ -z ${_kvpool_cmd_cache[$prog]+set} ]]; then
        _kvpool_cmd_cache[$prog]=$("$prog" help 2>/dev/null |
            awk '/^commands:/ { on = 1; next }
                 on && /^  [a-z]/ { print $1 }
                 on && /^$/ { exit }')
    fi
    printf '%s\n' "${_kvpool_cmd_cache[$prog]}"
}

# _kvpool_flags PROGRAM CMD: every --flag `PROGRAM CMD --help` names.
_kvpool_flags()
{
    local prog=$1 cmd=$2 key="$1 $2"
    if [[ -z ${_kvpool_flag_cache[$key]+set} ]]; then
        _kvpool_flag_cache[$key]=$( { "$prog" "$cmd" --help 2>/dev/null; echo --help; } |
            grep -oE -- '--[a-z0-9][a-z0-9-]*' | sort -u)
    fi
    printf '%s\n' "${_kvpool_flag_cache[$key]}"
}

_kvpool()
{
    local cur=${COMP_WORDS[COMP_CWORD]} prev='' prog=${COMP_WORDS[0]} cmd='' i
    (( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD-1]}
    # --flag=VALUE: bash splits at '=' (COMP_WORDBREAKS); the flag is before it
    if [[ $cur == = ]]; then
        prev=${COMP_WORDS[COMP_CWORD-1]}
        cur=
    elif [[ $prev == = ]] && (( COMP_CWORD > 1 )); then
        prev=${COMP_WORDS[COMP_CWORD-2]}
    fi
    # the subcommand: the first word after the program that is not a flag
    for (( i = 1; i < COMP_CWORD; i++ )); do
        if [[ ${COMP_WORDS[i]} != -* ]]; then
            cmd=${COMP_WORDS[i]}
            break
        fi
    done
    COMPREPLY=()
    if [[ -z $cmd ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_kvpool_commands "$prog") --help" -- "$cur")
        return 0
    fi
    case $cmd in
    help)
        (( i + 1 == COMP_CWORD )) &&
            mapfile -t COMPREPLY < <(compgen -W "config $(_kvpool_commands "$prog" |
                grep -vxE 'help|version')" -- "$cur")
        return 0
        ;;
    version) return 0 ;;
    esac
    case $prev in
    --config | --*-file)
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        return 0
        ;;
    --*-dir)
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -d -- "$cur")
        return 0
        ;;
    esac
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_kvpool_flags "$prog" "$cmd")" -- "$cur")
        return 0
    fi
    compopt -o filenames 2>/dev/null
    mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    return 0
}

complete -F _kvpool kvpool
