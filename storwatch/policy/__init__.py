"""Policy: rules over the View's entities that ask actions to run.

``schema`` declares what a rule reads (the fields of each entity kind) and builds those entities from a View;
``cel`` bounds and compiles a rule's condition; ``load`` reads policy files into a :class:`~.load.Policy`;
``engine`` evaluates it View after View, keeping each (rule, entity)'s state, and returns the action requests that
``storwatch.actions`` carries out; ``testing`` runs the test cases of ``storwatch policy test``.
"""
