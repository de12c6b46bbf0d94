# frozen_string_literal: true

require "ripper"

# The dependency graph among a tree's Ruby files, read from their source (Ripper's syntax tree, so
# comments and strings never count): an arrow from a file to each file it loads with
# `require_relative` (or `require "x"` of a file in the tree), and to each file that defines a
# constant it names. test/c/call_graph.rb's counterpart for lib/ (test/unit/ruby_graph_test.rb).
#
# How a constant reference finds its file: its first name is looked up as Ruby does lexically (the
# enclosing `module`/`class` bodies from the innermost outwards, then the top level), the rest of its
# path is appended, and the deepest prefix of that path some file defines (`module X`, `class X`,
# `X = ...`) is what it points at. A module a file only opens to hold others (`module Blackbuck`
# around a class, `module Rack; module Handler`) defines nothing there. A name defined in several
# files (`Blackbuck`: a method here, a method there) points at none, unless it is the receiver of a
# call (`Blackbuck.rack_version`): then at the file that defines that method. A path through
# `Native` (the C extension) is no file.
# Not seen: `const_get`, constants reached through a superclass or an included module, and calls on
# an object (`@worker.stop`): the arrows are what a reader sees, not all that runs.
module RubyGraph
  # arrows: {from => {to => [why, ...]}}, why: "require" (require_relative too) or the reference as written
  # (`WorkerExits.say`, `Messages::STOP`), paths relative to the root given to RubyGraph.build.
  Graph = Struct.new(:files, :arrows) do
    def edges = arrows.transform_values(&:keys)

    def why(from, to) = arrows.fetch(from, {}).fetch(to, []).uniq.sort.join(", ")

    def describe(path) = path.each_cons(2).map { |a, b| "#{a} -> #{b} (#{why(a, b)})" }.join("\n")
  end

  module_function

  # Reads every path (relative to root) and returns their Graph.
  def build(root, paths)
    files = paths.to_h { |p| [p, Source.new(p, File.read(File.join(root, p)))] }
    defined_in = Hash.new { |h, k| h[k] = [] }
    methods_in = Hash.new { |h, k| h[k] = [] }
    known = {}
    files.each_value do |f|
      f.constants.each { |c| defined_in[c] << f.path }
      (f.constants + f.namespaces).each { |c| known[c] = true }
      f.methods.each { |m| methods_in[m] << f.path }
    end
    defined_in.each_value(&:uniq!)
    arrows = files.keys.to_h { |p| [p, Hash.new { |h, k| h[k] = [] }] }
    files.each_value do |f|
      f.requires.each do |req|
        to = required_file(root, f.path, req, files)
        arrows[f.path][to] << "require" if to && to != f.path
      end
      f.references.each do |ref|
        to = owner(ref, known, defined_in, methods_in)
        arrows[f.path][to] << ref.text if to && to != f.path
      end
    end
    Graph.new(files.keys.sort, arrows.transform_values { |tos| Hash[tos] })
  end

  # The file in the tree a require names: [kind, string]; nil when it is none of them.
  def required_file(root, from, (kind, name), files)
    name = "#{name}.rb" unless name.end_with?(".rb")
    candidates = if kind == :relative
                   [File.expand_path(name, File.join(root, File.dirname(from)))]
                 else # require "x": x.rb under a load path root of the tree (its lib/, or the root)
                   [File.join(root, "lib", name), File.join(root, name)]
                 end
    candidates.map { |c| c.delete_prefix("#{File.expand_path(root)}/") }.find { |p| files.key?(p) }
  end

  # The one file a reference points at, or nil. known: every name some file defines or opens.
  def owner(ref, known, defined_in, methods_in)
    names = ref.names
    return nil if names.include?("Native")

    head = ref.top ? names.first : ref.scopes.reverse.map { |s| "#{s}::#{names.first}" }.find { |c| known[c] }
    head ||= names.first
    full = [head, *names.drop(1)].join("::").split("::")
    full.size.downto(1) do |n|
      name = full.first(n).join("::")
      next unless defined_in.key?(name)

      files = defined_in[name]
      return files.first if files.size == 1
      return nil unless n == full.size && ref.method

      owners = methods_in["#{name}.#{ref.method}"].uniq
      return owners.size == 1 ? owners.first : nil
    end
    nil
  end

  # The cycles among the files, each as [file, ..., file] (first and last the same), starting at its
  # least file: in each strongly connected component of more than one file, the shortest cycle
  # through each of its files (fewer when two files share one). Empty when there is none.
  def cycles(graph)
    edges = graph.edges
    components(edges).select { |c| c.size > 1 }.flat_map do |comp|
      members = comp.to_h { |f| [f, true] }
      comp.map do |file|
        ring = shortest_path(edges, file, file, members)[0...-1]
        ring = ring.rotate(ring.index(ring.min))
        ring + [ring.first]
      end.uniq
    end
  end

  # Tarjan's strongly connected components of {node => [node]}.
  def components(edges)
    index = {}
    low = {}
    stack = []
    on_stack = {}
    found = []
    counter = 0
    visit = lambda do |v|
      index[v] = low[v] = counter
      counter += 1
      stack.push(v)
      on_stack[v] = true
      edges.fetch(v, []).each do |w|
        if !index.key?(w)
          visit.call(w)
          low[v] = [low[v], low[w]].min
        elsif on_stack[w]
          low[v] = [low[v], index[w]].min
        end
      end
      next unless low[v] == index[v]

      comp = []
      loop do
        w = stack.pop
        on_stack.delete(w)
        comp << w
        break if w == v
      end
      found << comp.sort
    end
    edges.keys.sort.each { |v| visit.call(v) unless index.key?(v) }
    found
  end

  # Breadth-first: the shortest path from -> ... -> to (at least one arrow) inside members.
  def shortest_path(edges, from, to, members)
    came_from = {}
    queue = [from]
    until queue.empty?
      v = queue.shift
      edges.fetch(v, []).sort.each do |w|
        next unless members[w]

        if w == to
          path = [w, v]
          path << came_from[path.last] while path.last != from
          return path.reverse
        end
        next if came_from.key?(w) || w == from

        came_from[w] = v
        queue << w
      end
    end
    nil
  end

  # Arrows from a file under `from_dir` to a file under `to_dir`: [[from, to], ...].
  def arrows_between(graph, from_dir, to_dir)
    graph.edges.flat_map do |from, tos|
      next [] unless from.start_with?(from_dir)

      tos.select { |to| to.start_with?(to_dir) }.map { |to| [from, to] }
    end.sort
  end

  # A constant reference: names ["Messages", "STOP"]; top: written `::X`; scopes: the enclosing
  # module/class names, outermost first ("Blackbuck", "Blackbuck::Worker"); method: the method
  # called on it, when it is a call's receiver.
  Reference = Struct.new(:names, :top, :scopes, :method) do
    def text = "#{'::' if top}#{names.join('::')}#{".#{method}" if method}"
  end

  # One file's syntax tree, walked once: what it defines, names and requires.
  class Source
    attr_reader :path, :constants, :namespaces, :methods, :references, :requires

    def initialize(path, text)
      @path = path
      @constants = []
      @namespaces = []
      @methods = []
      @references = []
      @requires = []
      tree = quietly { Ripper.sexp(text, path) } or raise ArgumentError, "#{path}: Ripper cannot parse it"
      walk(tree, [], false)
    end

    private

    # (Ruby's own warnings about a file are for loading it, not for reading its arrows.)
    def quietly
      verbose = $VERBOSE
      $VERBOSE = nil
      yield
    ensure
      $VERBOSE = verbose
    end

    # scopes: the enclosing module/class full names; in_module: directly in a module's body, where
    # a plain `def` may be a module function (`module_function`).
    def walk(node, scopes, in_module)
      return unless node.is_a?(Array)
      return node.each { |n| walk(n, scopes, in_module) } unless node.first.is_a?(Symbol)

      case node.first
      when :module, :class
        name = definition_name(node[1], scopes)
        # `module Rack; module Handler` around our own: a namespace we only open, not one we define
        (namespace_only?(node) ? @namespaces : @constants) << name
        walk(node[2], scopes, false) if node.first == :class # superclass
        walk(node.last, scopes + [name], node.first == :module)
      when :sclass # class << self: its defs are the enclosing module's
        walk(node[2], scopes, true)
      when :assign, :opassign
        if (name = constant_field(node[1], scopes))
          @constants << name
        else
          walk(node[1], scopes, in_module)
        end
        node.drop(2).each { |n| walk(n, scopes, in_module) }
      when :def
        @methods << "#{scopes.last}.#{node[1][1]}" if in_module && scopes.last
        walk(node.drop(2), scopes, false)
      when :defs
        self_target = node[1].first == :var_ref && node[1][1][0..1] == [:@kw, "self"]
        @methods << "#{scopes.last}.#{node[3][1]}" if self_target && scopes.last
        walk(node.drop(4), scopes, false)
      when :var_ref, :const_path_ref, :top_const_ref
        reference(node, scopes, nil) || node.drop(1).each { |n| walk(n, scopes, in_module) }
      when :call, :command_call
        method = node[3].is_a?(Array) && node[3][1].is_a?(String) ? node[3][1] : nil
        reference(node[1], scopes, method) || walk(node[1], scopes, in_module)
        node.drop(2).each { |n| walk(n, scopes, in_module) }
      when :command, :method_add_arg # require_relative "x", require_relative("x")
        requirement(node)
        walk(node.drop(1), scopes, in_module)
      else
        node.drop(1).each { |n| walk(n, scopes, in_module) }
      end
    end

    # A module this file only opens: its body holds modules or classes, and defines no method and
    # no constant of its own (calls such as Rack's `register` aside).
    def namespace_only?(node)
      return false unless node.first == :module

      body = node.last
      stmts = body.first == :bodystmt ? body[1] : body
      stmts.any? { |s| %i[module class].include?(s.first) } && stmts.none? do |s|
        %i[def defs sclass].include?(s.first) || (%i[assign opassign].include?(s.first) && constant_field(s[1], []))
      end
    end

    # `module A::B` inside `module Blackbuck`: "Blackbuck::A::B" (A itself is a reference).
    def definition_name(node, scopes)
      case node.first
      when :const_ref then [scopes.last, node[1][1]].compact.join("::")
      when :top_const_ref then node[1][1]
      when :const_path_ref
        reference(node[1], scopes, nil) || walk(node[1], scopes, false)
        prefix = const_path(node[1]) or return [scopes.last, node[2][1]].compact.join("::")
        names, top = prefix
        [(scopes.last unless top), *names, node[2][1]].compact.join("::")
      end
    end

    # The full name a constant assignment defines, or nil when the target is not a constant.
    def constant_field(node, scopes)
      case node.first
      when :var_field
        node[1]&.first == :@const ? [scopes.last, node[1][1]].compact.join("::") : nil
      when :const_path_field
        names, top = const_path(node[1])
        names && [(scopes.last unless top), *names, node[2][1]].compact.join("::")
      when :top_const_field then node[1][1]
      end
    end

    # [names, top] when node is a constant path (Foo, Foo::Bar, ::Foo::Bar), else nil.
    def const_path(node)
      return nil unless node.is_a?(Array)

      case node.first
      when :var_ref then node[1].first == :@const ? [[node[1][1]], false] : nil
      when :top_const_ref then [[node[1][1]], true]
      when :const_path_ref
        (left = const_path(node[1])) && [left[0] + [node[2][1]], left[1]]
      end
    end

    # Records node as a reference when it is a constant path; true then.
    def reference(node, scopes, method)
      names, top = const_path(node)
      return false unless names

      @references << Reference.new(names, top, scopes, method)
      true
    end

    # require_relative "x" / require "x" with a plain string.
    def requirement(node)
      callee = node.first == :method_add_arg ? node[1] : [:fcall, node[1]]
      return unless callee.first == :fcall && callee[1].first == :@ident

      kind = { "require_relative" => :relative, "require" => :load_path }[callee[1][1]] or return
      args = node[2]
      args = args[1] if args&.first == :arg_paren
      args = args[1] if args&.first == :args_add_block
      lit = args&.first
      return unless lit&.first == :string_literal

      parts = lit[1].drop(1) # [:string_content, part, ...]
      return unless parts.size == 1 && parts[0].first == :@tstring_content

      @requires << [kind, parts[0][1]]
    end
  end
end
