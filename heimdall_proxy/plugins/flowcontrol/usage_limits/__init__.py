"""Usage-limit policies: how full each priority band may fill the pool before its requests
wait (flowControl.usageLimitPolicyPluginRef), asked by the flow controller at every dispatch
decision."""
